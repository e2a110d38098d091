"""Every event that crosses a process boundary, as msgspec Structs.

Wire format: msgpack (see `schemas.codec`). Rules that keep old and new processes talking:
- every event carries `schema_version`; new fields are added with a default, never renamed;
- decoders ignore fields they do not know (msgspec's default for map-encoded structs);
- decoding is strict: wrong types, NaN/inf numbers and negative indices are errors that name the
  field (`Expected int >= 0 - at $.steps[2].index`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

SCHEMA_VERSION = 1

# --- constrained scalar types: bounds double as NaN/inf guards (NaN fails every comparison) ---
Index = Annotated[int, Meta(ge=0)]
Version = Annotated[int, Meta(ge=0)]
Count = Annotated[int, Meta(ge=0)]
PositiveCount = Annotated[int, Meta(ge=1)]
# rollouts in a group: the bound of scheduler.rollouts_per_task, so that a request for 10**9 rollouts
# is refused at the schema (dead-lettered) instead of queuing that many episodes in an actor
GroupSize = Annotated[int, Meta(ge=1, le=1024)]
Finite = Annotated[float, Meta(ge=-1e30, le=1e30)]
Logprob = Annotated[float, Meta(ge=-1e30, le=0.0)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
Verdict = Literal[1, -1, 0]  # +1 good step, -1 bad step, 0 unparseable judgement
Outcome = Literal[1, -1]
Timestamp = Annotated[float, Meta(ge=0.0, le=1e11)]
Domain = Literal["household", "arith", "code", "textworld", "textworld-custom"]
TaskStatus = Literal["active", "pending", "retired"]
Direction = Literal["harder", "easier"]
ModelName = Literal["policy", "reward"]
Answer = Annotated[list[Index], Meta(min_length=1)]  # an answer's token ids


def now() -> float:
    return time.time()


class Event(Struct, frozen=True, kw_only=True):
    """Base of every wire event."""

    schema_version: PositiveCount = SCHEMA_VERSION


# --- forge.tasks (compacted, key task_id): forge / env model / seeding -> scheduler, forge, env model ---
class TaskSpec(Event, frozen=True, kw_only=True):
    """A task is data: any process rebuilds the same world from (domain, params, seed)."""

    task_id: str
    domain: Domain
    difficulty: Index
    params: dict[str, Any]
    seed: Count
    status: TaskStatus = "active"
    version: Version = 0  # bumped on every status change of the same task_id
    signature: str = ""  # equivalence key: two tasks with one signature are the same task
    parent_id: str | None = None
    direction: Direction | None = None  # how this variant relates to its parent
    parent_accuracy: Probability | None = None  # acc_prev used by the acceptance rule
    generation: Count = 0  # 0 for seed tasks, parent's + 1 for variants
    created_at: Timestamp = msgspec.field(default_factory=now)


# --- forge.rollout.requests (key request_id): scheduler -> actors ---
class RolloutRequest(Event, frozen=True, kw_only=True):
    request_id: str  # idempotency key of the whole group
    task: TaskSpec  # embedded so an actor needs no task table
    n: GroupSize  # rollouts in the group
    min_policy_version: Version = 0
    created_at: Timestamp = msgspec.field(default_factory=now)


def check_answer(answer: Any, before: str, after: str) -> None:
    """An answer's tokens, behaviour logprobs and listed prefix agree (a Step or a RejectedAnswer)."""
    tokens = len(answer.response_token_ids)
    if len(answer.behaviour_logprobs) != tokens:
        raise ValueError(
            f"{before}behaviour_logprobs has {len(answer.behaviour_logprobs)} values for "
            f"{tokens} response_token_ids{after}"
        )
    if answer.listed_prefix_tokens > 0 and answer.listed_prefix_tokens >= tokens:
        raise ValueError(
            f"{before}listed_prefix_tokens {answer.listed_prefix_tokens} leaves none of the "
            f"{tokens} response tokens{after}"
        )


class RejectedAnswer(Struct, frozen=True, kw_only=True):
    """An invalid answer the policy drew at a turn and the actor did not play (`actor.redraw` > 1: it
    played a later draw that named a listed action): what the policy would have answered, kept so that
    the format can be taught from it (`signals.invalid_penalty`)."""

    response_token_ids: list[Index]
    behaviour_logprobs: list[Logprob]
    listed_prefix_tokens: Index = 0  # leading tokens that still spell a listed action

    def __post_init__(self) -> None:
        check_answer(self, "rejected answer: ", "")


class Step(Struct, frozen=True, kw_only=True):
    """One policy turn: the prompt it saw, what it answered, and what the environment said back."""

    index: Index
    prompt: str
    response: str
    prompt_token_ids: list[Index]
    response_token_ids: list[Index]
    behaviour_logprobs: list[Logprob]  # one per response token, from the policy that sampled it
    policy_version: Version  # the weights that generated every token of this step
    observation: str = ""  # the environment's answer to this step (the judge sees it)
    valid_action: bool = True
    listed_prefix_tokens: Index = 0  # an invalid answer's leading tokens that still spell a listed action
    rejected: list[RejectedAnswer] = []  # invalid draws of this turn not played (prompt as above)
    # every listed action's answer as the policy's tokens (eos included): what a valid answer could have
    # been at this turn, for the listed-token loss (`policy_learner.listed_token_coef`) and the
    # listed-conditional term (`policy_learner.listed_conditional`); empty when both are off
    listed_answers: list[Answer] = []

    def __post_init__(self) -> None:
        check_answer(self, "", f" (step {self.index})")


# --- forge.trajectories (key request_id): actors -> judges ---
class Trajectory(Event, frozen=True, kw_only=True):
    request_id: str
    rollout_index: Index  # 0..n-1 within the request; (request_id, rollout_index) is the idempotency key
    group_size: GroupSize  # n of the request, so the signals stage knows when a group is whole
    task: TaskSpec
    steps: list[Step]
    outcome: Outcome
    actor_id: str = ""
    created_at: Timestamp = msgspec.field(default_factory=now)

    def __post_init__(self) -> None:
        if self.rollout_index >= self.group_size:
            raise ValueError(f"rollout_index {self.rollout_index} >= group_size {self.group_size}")

    @property
    def key(self) -> str:
        return f"{self.request_id}/{self.rollout_index}"


class Judgement(Struct, frozen=True, kw_only=True):
    """One reward-model generation about one step; training data for the reward learner."""

    verdict: Verdict
    prompt_token_ids: list[Index]
    response_token_ids: list[Index]
    behaviour_logprobs: list[Logprob]
    text: str = ""
    # Code domain: the judge's unit tests are scored CURE-style instead of by a verdict.
    score: Finite | None = None


class StepJudgement(Struct, frozen=True, kw_only=True):
    step_index: Index
    judgements: Annotated[list[Judgement], Meta(min_length=1)]  # m of them (a step without one has no reward)

    @property
    def verdicts(self) -> list[int]:
        return [j.verdict for j in self.judgements]


# --- forge.trajectories.judged (key request_id): judges -> signals, forge, archive, replay ---
class JudgedTrajectory(Event, frozen=True, kw_only=True):
    trajectory: Trajectory
    steps: list[StepJudgement]  # one per trajectory step, same order
    reward_version: Version
    judge_id: str = ""
    created_at: Timestamp = msgspec.field(default_factory=now)

    @property
    def key(self) -> str:
        return self.trajectory.key


# --- forge.samples.policy (key request_id): signals -> policy learner ---
class PolicySample(Struct, frozen=True, kw_only=True):
    sample_key: str  # request_id/rollout/step: the learner trains each key at most once
    task_id: str
    prompt_token_ids: list[Index]
    response_token_ids: list[Index]
    behaviour_logprobs: list[Logprob]
    policy_version: Version
    advantage: Finite
    reward: Finite  # integrated step reward R, for diagnostics
    advantage_from: Index = 0  # the first response token the advantage applies to (earlier ones: no loss)
    # where an invalid answer left every listed answer (Step.listed_answers) and the tokens that would
    # have stayed on one there: the listed-token loss (`policy_learner.listed_token_coef`); empty = none
    unlisted_at: Index = 0
    listed_tokens: list[Index] = []
    # a played valid answer's state's listed answers (Step.listed_answers): it is trained as a draw from
    # the policy conditioned on naming one of them (`policy_learner.listed_conditional`); empty = off
    listed_answers: list[Answer] = []


class PolicySampleBatch(Event, frozen=True, kw_only=True):
    request_id: str
    samples: list[PolicySample]
    created_at: Timestamp = msgspec.field(default_factory=now)


# --- forge.samples.reward (key request_id): signals -> reward learner ---
class RewardSample(Struct, frozen=True, kw_only=True):
    sample_key: str  # request_id/rollout/step/verdict
    prompt_token_ids: list[Index]
    response_token_ids: list[Index]
    behaviour_logprobs: list[Logprob]
    reward_version: Version
    advantage: Finite
    reward: Finite  # raw consistency reward before the z-score


class RewardSampleBatch(Event, frozen=True, kw_only=True):
    request_id: str
    samples: list[RewardSample]
    created_at: Timestamp = msgspec.field(default_factory=now)


# --- forge.groups (key request_id): signals -> scheduler ---
GroupAction = Literal["train", "partial", "rejected", "undecided", "timeout", "invalid"]
"""train: whole group; partial: what arrived before the timeout; the rest are drops: rejected (its
variant task was rejected), undecided (its variant never decided), timeout (under 2 rollouts), invalid
(a malformed group)."""


class GroupSettled(Event, frozen=True, kw_only=True):
    """What became of one rollout group once it left the signals stage: the scheduler's count of
    groups that train (policy_samples > 0) and of requests still running."""

    request_id: str
    task_id: str
    action: GroupAction
    rollouts: Count
    policy_samples: Count = 0
    reward_samples: Count = 0
    created_at: Timestamp = msgspec.field(default_factory=now)


class CriticFeedback(Struct, frozen=True, kw_only=True):
    """What the reward model saw, condensed for the env model (paper: critic feedback)."""

    high_risk_steps: list[list[Index]] = []  # per failed rollout: steps every verdict judged -1
    failed_actions: list[str] = []  # responses at those steps
    success_patterns: list[str] = []  # responses of successful rollouts (beyond the paper)


# --- forge.task.events (key task_id): forge -> env model, forge ---
class TaskEvent(Event, frozen=True, kw_only=True):
    event_id: str  # idempotency key
    task_id: str
    task_version: Version
    kind: Literal["harder", "easier", "accepted", "rejected"]
    accuracy: Probability
    rollouts: Count
    critic: CriticFeedback = CriticFeedback()
    parent_id: str | None = None
    created_at: Timestamp = msgspec.field(default_factory=now)


# --- forge.weights (compacted, key model name): learners -> actors, judges, learners, scheduler ---
class WeightsPublished(Event, frozen=True, kw_only=True):
    model: ModelName
    version: Version
    uri: str  # folder in the weight store holding model.safetensors + config
    sha256: str  # of model.safetensors; loaders refuse a mismatch
    bytes: Count
    preset: str = ""
    optimizer_step: Count = 0
    # rollout groups the learner had trained or dropped as stale when it published this version, the
    # count the scheduler's gate holds its requests against; None from a learner that does not count
    groups_consumed: Count | None = None
    created_at: Timestamp = msgspec.field(default_factory=now)

    def __post_init__(self) -> None:
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise ValueError(f"sha256 must be 64 lowercase hex digits, got {self.sha256!r}")


# --- forge.metrics (key role): every role -> status, report ---
class Metric(Event, frozen=True, kw_only=True):
    role: str
    name: str  # namespaced, e.g. learner/policy/loss
    value: Finite
    step: Count = 0
    labels: dict[str, str] = {}
    created_at: Timestamp = msgspec.field(default_factory=now)


class AboutRecord(Event, frozen=True, kw_only=True):
    """An event about one consumed record: where it was read (physical topic), and by which group."""

    source_topic: str
    partition: Index
    offset: Index
    group: str = ""


# --- forge.dlq (key source topic): bus runtime -> people ---
class DeadLetter(AboutRecord, frozen=True, kw_only=True):
    key: bytes | None
    value: bytes | None
    error: str
    created_at: Timestamp = msgspec.field(default_factory=now)


# --- forge.strikes (key group/topic/partition/offset): bus runtime -> bus runtime ---
class Strike(AboutRecord, frozen=True, kw_only=True):
    """A record's transient fault outlasted a round of retries and its consumer stopped (one strike)."""

    error: str
    created_at: Timestamp = msgspec.field(default_factory=now)


# --- forge.dlq.redriven (key "partition@offset" of the letter): `forgestream dlq redrive` -> itself ---
class Redriven(Event, frozen=True, kw_only=True):
    """A dead letter whose record was sent again to its source topic (at `to_offset`), for `group`."""

    dlq_partition: Index
    dlq_offset: Index
    source_topic: str
    to_offset: Index
    group: str = ""
    created_at: Timestamp = msgspec.field(default_factory=now)


def wire_logprobs(values: Iterable[float]) -> list[float]:
    """Behaviour logprobs as `Logprob` takes them: float rounding can give +1e-8, a masked token -inf."""
    return [min(0.0, max(-1e30, v)) for v in values]


def finite(x: float) -> float:
    """Fail loudly before a NaN reaches the wire (producers call this on computed rewards)."""
    if not math.isfinite(x):
        raise ValueError(f"non-finite value {x!r}")
    return x
