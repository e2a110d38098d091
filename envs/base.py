"""The contract every task domain keeps, so actors, the env model and bootstrap training treat
household, arith and code alike.

A task is data (`schemas.events.TaskSpec`): any process rebuilds the same world from
(domain, params, seed). An episode is a sequence of policy turns; each turn the policy sees
`episode.prompt()` and answers with text; `episode.step(text)` advances the world.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from schemas.events import CriticFeedback, TaskSpec

Direction = Literal["harder", "easier"]


@dataclass(frozen=True)
class StepResult:
    observation: str  # what the environment says back (shown to the judge and the next prompt)
    done: bool
    valid_action: bool = True  # False when the response could not be parsed into a legal action
    info: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class Episode(Protocol):
    task: TaskSpec
    max_steps: int

    def prompt(self) -> str:
        """The full text the policy is conditioned on for its next turn."""
        ...

    def step(self, response: str) -> StepResult:
        """Apply the policy's answer for this turn."""
        ...

    @property
    def done(self) -> bool: ...

    @property
    def outcome(self) -> Literal[1, -1]:
        """+1 if the task was achieved, else -1 (also -1 when cut off at max_steps)."""
        ...

    def judge_context(self, step_index: int) -> str:
        """Task and history up to (excluding) `step_index`, for the reward model's prompt."""
        ...


@runtime_checkable
class Environment(Protocol):
    domain: str
    levels: int  # difficulties are 0 .. levels-1, easiest first
    # how the reward model judges a step: a verdict \boxed{1} / \boxed{-1} (the paper's prompt), or
    # unit tests it writes for the step's program, run in the sandbox (CURE-style scores)
    judged_by: Literal["verdicts", "unit_tests"]

    def sample_task(self, difficulty: int, rng: random.Random) -> TaskSpec:
        """A fresh active task at that difficulty; deterministic in rng."""
        ...

    def reset(self, task: TaskSpec) -> Episode:
        """Rebuild the world of `task` (pure function of the spec) and start an episode."""
        ...

    def oracle(self, task: TaskSpec) -> list[str]:
        """Responses that solve the task, one per turn (demonstrations, solvability checks)."""
        ...

    def signature(self, task: TaskSpec) -> str:
        """Equivalence key: tasks with equal signatures are the same task."""
        ...

    def propose_variant(
        self,
        task: TaskSpec,
        direction: Direction,
        critic: CriticFeedback,
        rng: random.Random,
    ) -> TaskSpec | None:
        """A pending harder/easier candidate derived from `task`, or None if none exists."""
        ...
