"""Fold the bus's own topics into the figures people watch: versions, success, tasks, variants.

Everything here is derived from the event topics themselves (weights, tasks, task events, judged
trajectories, dead letters) plus the learners' metrics, so `status`, the live view of `up` and
`report` agree with each other and work for a stopped system as well as a running one.
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass, field
from typing import Any

from app.usage import CPU_METRIC, RSS_METRIC
from infra.bus import RecentKeys
from pipeline.taskpool import TaskPool
from schemas import events as ev
from schemas import topics as tp

# Topics whose records feed Progress (read in full by `status` and `report`, followed by `up`).
PROGRESS_TOPICS = [tp.WEIGHTS, tp.TASKS, tp.TASK_EVENTS, tp.JUDGED, tp.METRICS, tp.DLQ]


MAX_POINTS = 4096  # per series: a run of days keeps its whole time range at a coarser step


def thin(points: list[Any]) -> None:
    """Halve a list in place, keeping its first and last point (bounded memory, whole time range)."""
    last = points[-1]
    del points[1::2]
    if points[-1] is not last:
        points.append(last)


@dataclass
class Series:
    """A time series sampled whenever the value changes, at most MAX_POINTS points."""

    t: list[float] = field(default_factory=list)
    y: list[float] = field(default_factory=list)

    def add(self, t: float, y: float) -> None:
        if self.y and self.y[-1] == y and self.t[-1] == t:
            return
        self.t.append(t)
        self.y.append(y)
        if len(self.t) > MAX_POINTS:
            thin(self.t)
            thin(self.y)


@dataclass
class Progress:
    success_window: int = 128
    versions: dict[str, int] = field(default_factory=dict)
    tasks: TaskPool = field(default_factory=TaskPool)
    trajectories: int = 0  # distinct judged trajectories
    judged_keys: RecentKeys = field(default_factory=lambda: RecentKeys(100_000))  # redelivery window
    outcomes: collections.deque[int] = field(default_factory=collections.deque)
    accepted: set[str] = field(default_factory=set)
    rejected: set[str] = field(default_factory=set)
    task_events: int = 0
    dlq: int = 0
    samples_trained: dict[str, float] = field(default_factory=dict)
    # staleness metric values (learner version - sample version, a batch's mean): histogram of their
    # whole-version floors, and the running sum for the mean
    staleness: collections.Counter[int] = field(default_factory=collections.Counter)
    staleness_sum: float = 0.0
    # policy samples by staleness (learner version - sample version), as the learner kept them
    staleness_samples: collections.Counter[int] = field(default_factory=collections.Counter)
    verdict_agree: int = 0
    verdict_total: int = 0
    metrics_last: dict[str, float] = field(default_factory=dict)
    series: dict[str, Series] = field(default_factory=lambda: collections.defaultdict(Series))
    difficulty_snapshots: list[tuple[float, dict[int, int]]] = field(default_factory=list)
    # policy version a rollout started with -> its task's difficulty -> [successes, rollouts] (the env
    # model moves tasks between levels: pooled over levels, a version's success says more about its mix)
    success_by_version: dict[int, dict[int, list[int]]] = field(default_factory=dict)
    # evaluator: level ("8"; "8 redraw" for the redraw mode) -> {policy version: held-out success};
    # reward version -> process accuracy
    heldout: dict[str, dict[int, float]] = field(default_factory=dict)
    process_accuracy: dict[str, dict[int, float]] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    # process (its roles) -> pid -> last reported CPU seconds / peak MiB: a restart is a new pid
    cpu_s: dict[str, dict[str, float]] = field(default_factory=dict)
    rss_peak_mb: dict[str, dict[str, float]] = field(default_factory=dict)

    # --- folding ---
    def apply(self, topic: str, value: Any, timestamp: float) -> None:
        """Fold one decoded record of a PROGRESS_TOPICS topic (logical name) observed at `timestamp`."""
        if topic == tp.WEIGHTS:
            self.versions[value.model] = max(self.versions.get(value.model, 0), value.version)
            self.series[f"{value.model}_version"].add(timestamp, self.versions[value.model])
        elif topic == tp.TASKS:
            self.tasks.update(value)  # a late, older version never overwrites a newer one
            self.series["tasks_active"].add(timestamp, self.count_status("active"))
            self.series["tasks_pending"].add(timestamp, self.count_status("pending"))
            self.difficulty_snapshots.append((timestamp, self.difficulty_spread()))
            if len(self.difficulty_snapshots) > MAX_POINTS:
                thin(self.difficulty_snapshots)
        elif topic == tp.TASK_EVENTS:
            self.task_events += 1
            if value.kind == "accepted":
                self.accepted.add(value.task_id)
            elif value.kind == "rejected":
                self.rejected.add(value.task_id)
            self.series["variants_accepted"].add(timestamp, len(self.accepted))
            self.series["variants_rejected"].add(timestamp, len(self.rejected))
        elif topic == tp.JUDGED:
            self._apply_judged(value, timestamp)
        elif topic == tp.METRICS:
            self._apply_metric(value, timestamp)
        elif topic == tp.DLQ:
            self.dlq += 1
            self.series["dlq"].add(timestamp, self.dlq)

    def _apply_judged(self, judged: ev.JudgedTrajectory, timestamp: float) -> None:
        if judged.key in self.judged_keys:  # at-least-once delivery: count effects, not deliveries
            return
        self.judged_keys.add(judged.key)
        self.trajectories += 1
        outcome = judged.trajectory.outcome
        self.outcomes.append(outcome)
        if judged.trajectory.steps:
            version = min(step.policy_version for step in judged.trajectory.steps)
            by_level = self.success_by_version.setdefault(version, {})
            tally = by_level.setdefault(judged.trajectory.task.difficulty, [0, 0])
            tally[0] += int(outcome == 1)
            tally[1] += 1
        while len(self.outcomes) > self.success_window:
            self.outcomes.popleft()
        # Verdict agreement: a verdict agrees when it has the sign of the rollout's outcome.
        for step in judged.steps:
            for verdict in step.verdicts:
                if verdict != 0:
                    self.verdict_total += 1
                    self.verdict_agree += int(verdict == outcome)
        self.series["trajectories"].add(timestamp, self.trajectories)
        self.series["success_rate"].add(timestamp, self.success_rate)
        if self.verdict_total:
            self.series["verdict_agreement"].add(timestamp, self.verdict_agree / self.verdict_total)

    def add_usage(
        self, process: str, pid: str, *, cpu_s: float | None = None, rss_peak_mb: float | None = None
    ) -> None:
        """One usage report of a process; both figures are cumulative (a late, smaller one changes nothing)."""
        for table, value in ((self.cpu_s, cpu_s), (self.rss_peak_mb, rss_peak_mb)):
            if value is not None:
                by_pid = table.setdefault(process, {})
                by_pid[pid] = max(by_pid.get(pid, 0.0), value)

    def _apply_metric(self, metric: ev.Metric, timestamp: float) -> None:
        self.metrics_last[metric.name] = metric.value
        if metric.name in (CPU_METRIC, RSS_METRIC):
            figure = "cpu_s" if metric.name == CPU_METRIC else "rss_peak_mb"
            process, pid = metric.labels.get("process", metric.role), metric.labels.get("pid", "?")
            self.add_usage(process, pid, **{figure: metric.value})
            return
        if metric.name == "eval/policy/success":
            level, mode = metric.labels.get("level", "?"), metric.labels.get("mode", "sampled")
            curve = level if mode == "sampled" else f"{level} {mode}"
            self.heldout.setdefault(curve, {})[metric.step] = metric.value
        elif metric.name in ("eval/reward/accuracy", "eval/reward/balanced_accuracy"):
            self.process_accuracy.setdefault(metric.name.rsplit("/", 1)[1], {})[metric.step] = metric.value
        if metric.name.endswith("staleness"):
            self.staleness[math.floor(metric.value)] += 1
            self.staleness_sum += metric.value
        if metric.name == "learner/policy/staleness_samples":
            self.staleness_samples[int(metric.labels.get("versions", "0"))] += int(metric.value)
        for model in ("policy", "reward"):
            if metric.name == f"learner/{model}/samples_trained":
                # Cumulative counter per learner process; a restarted learner resumes its count.
                self.samples_trained[model] = max(self.samples_trained.get(model, 0.0), metric.value)
                self.series[f"{model}_samples_trained"].add(timestamp, self.samples_trained[model])
            if metric.name == f"learner/{model}/version":
                self.versions[model] = max(self.versions.get(model, 0), int(metric.value))

    # --- views ---
    def count_status(self, status: str) -> int:
        return self.tasks.count(status)

    def difficulty_spread(self) -> dict[int, int]:
        spread: dict[int, int] = collections.Counter()
        for task in self.tasks.tasks.values():
            if task.status == "active":
                spread[task.difficulty] += 1
        return dict(sorted(spread.items()))

    @property
    def success_rate(self) -> float:
        return sum(o > 0 for o in self.outcomes) / len(self.outcomes) if self.outcomes else 0.0

    def trajectories_per_s(self, window_s: float = 60.0) -> float:
        s = self.series.get("trajectories")
        if not s or len(s.t) < 2:
            return 0.0
        t_end = s.t[-1]
        i = next((k for k, t in enumerate(s.t) if t >= t_end - window_s), 0)
        dt = t_end - s.t[i]
        return (s.y[-1] - s.y[i]) / dt if dt > 0 else 0.0

    def snapshot(self, lag: dict[str, int] | None = None) -> dict[str, Any]:
        """The `forgestream status --json` document."""
        return {
            "policy_version": self.versions.get("policy", 0),
            "reward_version": self.versions.get("reward", 0),
            "trajectories": self.trajectories,
            "samples_trained": int(self.samples_trained.get("policy", 0)),
            "reward_samples_trained": int(self.samples_trained.get("reward", 0)),
            "tasks_active": self.count_status("active"),
            "tasks_pending": self.count_status("pending"),
            "tasks_retired": self.count_status("retired"),
            "task_events": self.task_events,
            "variants_accepted": len(self.accepted),
            "variants_rejected": len(self.rejected),
            "success_rate": round(self.success_rate, 4),
            "trajectories_per_s": round(self.trajectories_per_s(), 3),
            "staleness_mean": round(self.staleness_sum / total, 3)
            if (total := self.staleness.total())
            else 0.0,
            "verdict_agreement": round(self.verdict_agree / self.verdict_total, 4)
            if self.verdict_total
            else 0.0,
            "staleness_samples": {str(k): v for k, v in sorted(self.staleness_samples.items())},
            "dlq": self.dlq,
            # newest held-out evaluation per level, newest process accuracy: {"v": version, "value": x}
            "heldout_success": {lv: _newest(by_v) for lv, by_v in sorted(self.heldout.items())},
            "process_accuracy": {k: _newest(by_v) for k, by_v in sorted(self.process_accuracy.items())},
            "lag": dict(lag or {}),
            # CPU seconds per process (its roles), summed over its copies and restarts; peak MiB of
            # its largest copy
            "cpu_s": {p: round(sum(by_pid.values()), 1) for p, by_pid in sorted(self.cpu_s.items())},
            "rss_peak_mb": {p: round(max(by_pid.values())) for p, by_pid in sorted(self.rss_peak_mb.items())},
        }


def _newest(by_version: dict[int, float]) -> dict[str, float]:
    version = max(by_version)
    return {"version": version, "value": round(by_version[version], 4)}
