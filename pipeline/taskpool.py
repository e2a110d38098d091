"""The task pool: the last TaskSpec per task_id, as read from `forge.tasks`.

Tansu never compacts, and even Kafka's compaction lags, so readers of the compacted tasks topic
keep the last value per key themselves; a late, older version never overwrites a newer one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import anyio

from infra.bus import Bus
from schemas.events import TaskSpec
from schemas.topics import TASKS

LIVE = ("active", "pending")


class TaskView(Protocol):
    def update(self, task: TaskSpec) -> bool | None: ...


async def restore_tasks(bus: Bus, view: TaskView) -> None:
    """Every task so far into `view`, before a role's first decision."""
    for record in await bus.read_topic(TASKS):
        view.update(record.value)


async def follow_tasks(
    bus: Bus,
    view: TaskView,
    shutdown: anyio.Event,
    on_change: Callable[[], Awaitable[None] | None] | None = None,
) -> None:
    """Keep `view` current (from the beginning, then as tasks change) until `shutdown`; `on_change`
    runs after each update that changed it (a view whose update returns None: after every update)."""
    async for record in bus.follow_topic(TASKS, shutdown=shutdown):
        changed = view.update(record.value)
        if on_change is not None and changed is not False:
            done = on_change()
            if done is not None:
                await done


@dataclass
class TaskPool:
    tasks: dict[str, TaskSpec] = field(default_factory=dict)

    def update(self, task: TaskSpec) -> bool:
        """Keep `task` unless a newer version is known; False for an older version or a replay of the
        one we have (nothing changed)."""
        current = self.tasks.get(task.task_id)
        if current is not None and (current.version > task.version or current == task):
            return False
        self.tasks[task.task_id] = task
        return True

    def __len__(self) -> int:
        return len(self.tasks)

    def count(self, status: str) -> int:
        return sum(1 for t in self.tasks.values() if t.status == status)

    def schedulable(self) -> list[TaskSpec]:
        """Active tasks and pending variants: both are rolled out."""
        return [t for t in self.tasks.values() if t.status in LIVE]

    def live_signatures(self) -> set[str]:
        return {t.signature for t in self.tasks.values() if t.status in LIVE and t.signature}

    def eligible(self, task_id: str) -> TaskSpec | None:
        """The task if it is active and has no pending child (may get a variant), else None."""
        task = self.tasks.get(task_id)
        if task is None or task.status != "active":
            return None
        if any(t.parent_id == task_id and t.status == "pending" for t in self.tasks.values()):
            return None
        return task
