"""signals: whole groups of judged rollouts -> policy and reward-model training samples.

Consumes `forge.trajectories.judged` (group "signals"; keyed by request_id, so the n rollouts of a
request share a partition and one member gathers the whole group) and follows `forge.tasks` from the
beginning without a group (every member needs every task's status).
Produces one `PolicySampleBatch` per group on `forge.samples.policy` (a sample per (rollout, step)
with a non-zero advantage) and one `RewardSampleBatch` on `forge.samples.reward` (a sample per
judgement with a non-zero advantage, only when lo <= group accuracy <= hi); the math is
`algorithm.group_signals` (R = O + λ·mean S, per-step z-scores, consistency / CURE rewards). Then,
for every group that leaves, trained or dropped, a `GroupSettled` on `forge.groups`: how the
scheduler counts running requests and groups that train, without redoing this stage's decisions.

Invariants:
- a group is published once it holds group_size distinct rollouts (duplicate deliveries of a
  trajectory key are ignored, and so are late copies of a finished request, within a bounded LRU);
- a group whose task was *pending* when requested waits for forge's verdict on `forge.tasks`: the
  variant seen active (accepted) -> published; seen retired without having been active (rejected) ->
  dropped and counted;
- a group incomplete after `signals.group_timeout_s` (or held that long undecided, or pushed out by
  `signals.max_open_groups`) is flushed with the rollouts it has (>= 2 and trainable) or dropped;
  both are counted (`signals/groups_incomplete`, `signals/groups_dropped`).

Offsets (why a watermark and not a rebuild): a group spans several records, so committing a record's
offset right after reading it would lose the group's earlier records on a crash. We commit per
partition `min(first offset of every group still in memory, last read + 1)`: a restarted or newly
assigned member re-reads from there and rebuilds every unfinished group from its own records. Records
past the watermark whose groups were already published are re-read too; copies are skipped by the
finished-request LRU, which a start fills from `forge.groups` (every group settled so far, by any
member), and the learners train each group at most once whatever reaches them. Partitions that move
away drop their groups here: the new owner rebuilds them from the committed watermark.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import anyio

from infra.bus import BatchConsumer, Bus, RecentKeys, Record
from pipeline.groups import RolloutGroup
from pipeline.samples import build_samples
from pipeline.taskpool import TaskPool, follow_tasks
from schemas.config import ListedAnswers, RunConfig, SignalsConfig
from schemas.events import GroupAction, GroupSettled, JudgedTrajectory, TaskSpec
from schemas.topics import GROUPS, JUDGED, SAMPLES_POLICY, SAMPLES_REWARD

log = logging.getLogger("forgestream.signals")
GROUP = "signals"
Action = GroupAction  # what leaves the gatherer (schemas.events: trained, in part, or dropped and why)
DROPS: tuple[Action, ...] = ("rejected", "undecided", "timeout")


@dataclass
class Group(RolloutGroup):
    """A group in flight: its rollouts so far, where its records start, when it opened and completed."""

    task: TaskSpec  # as embedded in the request (status at request time)
    opened_at: float
    first_offsets: dict[tuple[str, int], int] = field(default_factory=dict)  # (topic, partition) -> offset
    complete_at: float | None = None


class TaskStatuses:
    """What `forge.tasks` said so far: the newest spec per task_id, and which variants were accepted."""

    def __init__(self) -> None:
        self.pool = TaskPool()
        self.accepted: set[str] = set()

    def update(self, spec: TaskSpec) -> None:
        self.pool.update(spec)
        if spec.status == "active" and spec.parent_id is not None:
            self.accepted.add(spec.task_id)  # variants are born pending: active means accepted

    def decision(self, task: TaskSpec) -> str:
        """'train', 'hold' (pending variant not decided yet) or 'drop' (variant rejected)."""
        if task.status != "pending" or task.task_id in self.accepted:
            return "train"
        current = self.pool.tasks.get(task.task_id)
        if current is not None and current.status == "active" and current.version > task.version:
            return "train"
        if current is not None and current.status == "retired":
            return "drop"
        return "hold"


class Gatherer:
    """Groups in flight, their decisions and the committable watermark (no I/O: unit-testable)."""

    def __init__(self, config: SignalsConfig, dedup_window: int) -> None:
        self.config = config
        self.tasks = TaskStatuses()
        self.groups: OrderedDict[str, Group] = OrderedDict()  # oldest first
        self.finished = RecentKeys(max(dedup_window, 1))  # finished request ids, LRU-bounded
        self.read_up_to: dict[tuple[str, int], int] = {}  # next offset after the last record read
        self.duplicates = 0

    def add(self, record: Record[JudgedTrajectory], now: float) -> None:
        tp = (record.topic, record.partition)
        self.read_up_to[tp] = max(self.read_up_to.get(tp, 0), record.offset + 1)
        judged = record.value
        trajectory = judged.trajectory
        if trajectory.request_id in self.finished:
            self.duplicates += 1
            return
        group = self.groups.get(trajectory.request_id)
        if group is None:
            group = Group(trajectory.request_id, trajectory.group_size, trajectory.task, opened_at=now)
            self.groups[trajectory.request_id] = group
        if not group.add(judged):
            self.duplicates += 1
        group.first_offsets.setdefault(tp, record.offset)
        if group.complete and group.complete_at is None:
            group.complete_at = now

    def decide(self, now: float) -> list[tuple[Group, Action]]:
        """Groups leaving memory now, with what to do: train, train what arrived (partial), or drop for
        a reason (`DROPS`)."""
        out: list[tuple[Group, Action]] = []
        timeout = self.config.group_timeout_s
        overflow = len(self.groups) - self.config.max_open_groups
        for group in list(self.groups.values()):
            decision = self.tasks.decision(group.task)
            expired = overflow > 0 or now - group.opened_at >= timeout
            if decision == "drop":
                action: Action = "rejected"
            elif group.complete and decision == "train":
                action = "train"
            elif not expired:
                continue
            elif decision == "hold":
                action = "undecided"
            else:
                action = "partial" if len(group.rollouts) >= 2 else "timeout"
            overflow -= 1
            out.append((group, action))
            self.finish(group.request_id)
        return out

    def finish(self, request_id: str) -> None:
        self.groups.pop(request_id, None)
        self.finished.add(request_id)

    def forget_partitions(self, assigned: set[tuple[str, int]]) -> int:
        """Drop groups and read positions of partitions we no longer own; returns groups dropped."""
        gone = [rid for rid, g in self.groups.items() if any(tp not in assigned for tp in g.first_offsets)]
        for rid in gone:
            del self.groups[rid]
        for tp in [tp for tp in self.read_up_to if tp not in assigned]:
            del self.read_up_to[tp]
        return len(gone)

    def watermark(self) -> dict[tuple[str, int], int]:
        """Per partition, the next offset that is safe to commit."""
        marks = dict(self.read_up_to)
        for group in self.groups.values():
            for tp, offset in group.first_offsets.items():
                if tp in marks:
                    marks[tp] = min(marks[tp], offset)
        return marks


async def _publish(
    bus: Bus, group: Group, action: Action, config: SignalsConfig, listed: ListedAnswers
) -> None:
    """The group's samples (unless it is dropped), then its GroupSettled."""
    policy_samples = reward_samples = 0
    if action in DROPS:
        log.info("group %s dropped (%s, %d rollouts)", group.request_id, action, len(group.rollouts))
        await bus.metric("signals/groups_dropped", 1.0, reason=action)
    else:
        try:
            policy, reward, signals = build_samples(
                group.request_id,
                group.ordered(),
                config,
                listed_token_loss=listed.token_loss,
                listed_conditional=listed.conditional,
            )
        except ValueError as e:  # a malformed group cannot be trained on; never stop the stage for it
            log.warning("group %s dropped: %s", group.request_id, e)
            await bus.metric("signals/groups_dropped", 1.0, reason="invalid")
            action = "invalid"
        else:
            if policy.samples:
                await bus.send(SAMPLES_POLICY, policy, key=group.request_id)
            if reward.samples:
                await bus.send(SAMPLES_REWARD, reward, key=group.request_id)
            policy_samples, reward_samples = len(policy.samples), len(reward.samples)
            await bus.metric("signals/policy_samples", float(policy_samples))
            await bus.metric("signals/reward_samples", float(reward_samples))
            await bus.metric("signals/group_accuracy", signals.accuracy, task=group.task.task_id)
            if action == "partial":
                await bus.metric("signals/groups_incomplete", 1.0)
    settled = GroupSettled(request_id=group.request_id, task_id=group.task.task_id, action=action,
                           rollouts=len(group.rollouts), policy_samples=policy_samples,
                           reward_samples=reward_samples)  # fmt: skip
    await bus.send(GROUPS, settled, key=group.request_id)


async def run(config: RunConfig, *, shutdown: anyio.Event | None = None) -> None:
    """Gather judged groups and publish their training samples until `shutdown` is set."""
    shutdown = shutdown or anyio.Event()
    settings = config.signals
    gatherer = Gatherer(settings, config.kafka.dedup_window)
    async with Bus(config.kafka, role="signals") as bus, anyio.create_task_group() as tg:
        tg.start_soon(follow_tasks, bus, gatherer.tasks, shutdown)
        # groups settled before this start (by us before a restart, or by the member that had our
        # partitions): their records past the watermark are re-read, and must not publish again
        for record in await bus.read_topic(GROUPS):
            gatherer.finished.add(record.value.request_id)
        async with BatchConsumer(bus, [JUDGED], group=GROUP) as consumer:
            committed: dict[tuple[str, int], int] = {}
            while not shutdown.is_set():
                # --- gather ---
                # (the 1 s poll timeout also wakes us for group timeouts and task decisions)
                for record in await consumer.next_batch(settings.fetch_records, timeout_s=1.0):
                    gatherer.add(record, time.monotonic())
                lost = gatherer.forget_partitions(consumer.assignment())
                if lost:
                    log.info("%d groups left with their partitions; their new owner rebuilds them", lost)
                # --- publish whole (or expired) groups ---
                # (the policy learner's losses decide what rides on the samples)
                for group, action in gatherer.decide(time.monotonic()):
                    await _publish(bus, group, action, settings, config.listed_answers)
                # --- commit what no group in memory still needs ---
                marks = {tp: o for tp, o in gatherer.watermark().items() if committed.get(tp) != o}
                if marks:
                    await consumer.commit(marks)
                    committed.update(marks)
            tg.cancel_scope.cancel()
