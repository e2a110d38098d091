"""The task pool: the last TaskSpec per task_id, as read from `forge.tasks`.

Tansu never compacts, and even Kafka's compaction lags, so readers of the compacted tasks topic
keep the last value per key themselves; a late, older version never overwrites a newer one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.events import TaskSpec

LIVE = ("active", "pending")


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
