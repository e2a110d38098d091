"""Topic names, keys, value types and configs: the DESIGN topics table as code.

Names are constants; a run-wide prefix (`KafkaConfig.topic_prefix`) is prepended so two runs can
share one cluster (`TopicNames(prefix).of(TRAJECTORIES)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from msgspec import Struct

from schemas import events as ev

TASKS = "forge.tasks"
ROLLOUT_REQUESTS = "forge.rollout.requests"
TRAJECTORIES = "forge.trajectories"
JUDGED = "forge.trajectories.judged"
SAMPLES_POLICY = "forge.samples.policy"
SAMPLES_REWARD = "forge.samples.reward"
TASK_EVENTS = "forge.task.events"
WEIGHTS = "forge.weights"
METRICS = "forge.metrics"
DLQ = "forge.dlq"

_WEEK_MS = 7 * 24 * 3600 * 1000
_LONG_MS = -1  # keep forever: the replay source


@dataclass(frozen=True)
class TopicSpec:
    name: str
    key: str  # what the record key is (documentation + status output)
    value_type: type[Struct]
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)

    @property
    def compacted(self) -> bool:
        return self.configs.get("cleanup.policy") == "compact"


def _delete(retention_ms: int = _WEEK_MS) -> dict[str, str]:
    return {"cleanup.policy": "delete", "retention.ms": str(retention_ms)}


_COMPACT = {"cleanup.policy": "compact"}

TOPICS: dict[str, TopicSpec] = {
    t.name: t
    for t in [
        TopicSpec(TASKS, "task_id", ev.TaskSpec, 4, _COMPACT),
        TopicSpec(ROLLOUT_REQUESTS, "request_id", ev.RolloutRequest, 8, _delete()),
        TopicSpec(TRAJECTORIES, "request_id", ev.Trajectory, 8, _delete(_LONG_MS)),
        TopicSpec(JUDGED, "request_id", ev.JudgedTrajectory, 8, _delete(_LONG_MS)),
        TopicSpec(SAMPLES_POLICY, "request_id", ev.PolicySampleBatch, 4, _delete()),
        TopicSpec(SAMPLES_REWARD, "request_id", ev.RewardSampleBatch, 4, _delete()),
        TopicSpec(TASK_EVENTS, "task_id", ev.TaskEvent, 4, _delete()),
        TopicSpec(WEIGHTS, "model", ev.WeightsPublished, 1, _COMPACT),
        TopicSpec(METRICS, "role", ev.Metric, 4, _delete()),
        TopicSpec(DLQ, "source topic", ev.DeadLetter, 1, _delete(_LONG_MS)),
    ]
}


@dataclass(frozen=True)
class TopicNames:
    """Maps logical topic names to the physical (prefixed) ones and back."""

    prefix: str = ""

    def of(self, logical: str) -> str:
        if logical not in TOPICS:
            raise KeyError(f"unknown topic {logical!r}; known: {sorted(TOPICS)}")
        return self.prefix + logical

    def logical(self, physical: str) -> str:
        name = physical.removeprefix(self.prefix)
        if name not in TOPICS:
            raise KeyError(f"{physical!r} is not a forgestream topic under prefix {self.prefix!r}")
        return name

    def spec(self, physical_or_logical: str) -> TopicSpec:
        name = physical_or_logical
        if name not in TOPICS:
            name = self.logical(name)
        return TOPICS[name]

    def all(self) -> list[str]:
        return [self.prefix + name for name in TOPICS]
