"""Topic names, keys, value types and configs: the DESIGN topics table as code.

Names are `Topic[E]` constants (a str that carries its event type); a run-wide prefix (`KafkaConfig.topic_prefix`) is prepended so two runs can
share one cluster (`TopicNames(prefix).of(TRAJECTORIES)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from msgspec import Struct

from schemas import events as ev

E = TypeVar("E", bound=Struct)


class Topic(str, Generic[E]):
    """A topic's logical name that also carries its event type: a `str` (it keys dicts, compares and
    prints as the name), and for type checkers `bus.read_topic(JUDGED)` is `list[Record[JudgedTrajectory]]`
    and a handler of `bus.consume([TRAJECTORIES], ...)` receives `Record[Trajectory]`."""

    value_type: type[E]

    def __new__(cls, name: str, value_type: type[E]) -> Topic[E]:
        topic = super().__new__(cls, name)
        topic.value_type = value_type
        return topic


TASKS = Topic("forge.tasks", ev.TaskSpec)
ROLLOUT_REQUESTS = Topic("forge.rollout.requests", ev.RolloutRequest)
TRAJECTORIES = Topic("forge.trajectories", ev.Trajectory)
JUDGED = Topic("forge.trajectories.judged", ev.JudgedTrajectory)
SAMPLES_POLICY = Topic("forge.samples.policy", ev.PolicySampleBatch)
SAMPLES_REWARD = Topic("forge.samples.reward", ev.RewardSampleBatch)
GROUPS = Topic("forge.groups", ev.GroupSettled)
TASK_EVENTS = Topic("forge.task.events", ev.TaskEvent)
WEIGHTS = Topic("forge.weights", ev.WeightsPublished)
METRICS = Topic("forge.metrics", ev.Metric)
DLQ = Topic("forge.dlq", ev.DeadLetter)
REDRIVEN = Topic("forge.dlq.redriven", ev.Redriven)
STRIKES = Topic("forge.strikes", ev.Strike)

# A redriven record carries the dead letter it came from ("partition@offset") and, when one consumer
# group dead-lettered it, that group's id: other groups and group-less readers skip it (they had
# handled, or seen, the original).
REDRIVE_HEADER = "forgestream-redrive"
REDRIVE_GROUP_HEADER = "forgestream-redrive-group"

_WEEK_MS = 7 * 24 * 3600 * 1000
_LONG_MS = -1  # keep forever: the replay source


@dataclass(frozen=True)
class TopicSpec:
    name: Topic
    key: str  # what the record key is (documentation + status output)
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)

    @property
    def value_type(self) -> type[Struct]:
        return self.name.value_type

    @property
    def compacted(self) -> bool:
        return self.configs.get("cleanup.policy") == "compact"


def _delete(retention_ms: int = _WEEK_MS) -> dict[str, str]:
    return {"cleanup.policy": "delete", "retention.ms": str(retention_ms)}


_COMPACT = {"cleanup.policy": "compact"}

TOPICS: dict[str, TopicSpec] = {
    t.name: t
    for t in [
        TopicSpec(TASKS, "task_id", 4, _COMPACT),
        TopicSpec(ROLLOUT_REQUESTS, "request_id", 8, _delete()),
        # one key per trajectory: a group's n trajectories spread over the judges (keyed by request,
        # one judge judged a whole group while the others idled); judged ones regroup by request
        TopicSpec(TRAJECTORIES, "request_id/rollout_index", 8, _delete(_LONG_MS)),
        TopicSpec(JUDGED, "request_id", 8, _delete(_LONG_MS)),
        TopicSpec(SAMPLES_POLICY, "request_id", 4, _delete()),
        TopicSpec(SAMPLES_REWARD, "request_id", 4, _delete()),
        TopicSpec(GROUPS, "request_id", 4, _delete()),
        TopicSpec(TASK_EVENTS, "task_id", 4, _delete()),
        TopicSpec(WEIGHTS, "model", 1, _COMPACT),
        TopicSpec(METRICS, "role", 4, _delete()),
        TopicSpec(DLQ, "source topic", 1, _delete(_LONG_MS)),
        TopicSpec(REDRIVEN, "the letter's partition@offset", 1, _delete(_LONG_MS)),
        TopicSpec(STRIKES, "group/topic/partition/offset", 1, _delete()),
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
