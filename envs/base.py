"""The contract every task domain keeps, so actors, the env model and bootstrap training treat
household, arith and code alike.

A task is data (`schemas.events.TaskSpec`): any process rebuilds the same world from
(domain, params, seed). An episode is a sequence of policy turns; each turn the policy sees
`episode.prompt()` and answers with text; `episode.step(text)` advances the world.
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from schemas.events import CriticFeedback, TaskSpec

Direction = Literal["harder", "easier"]


# Domains that list their admissible actions (household, textworld) take an answer that names one:
# `\\boxed{ open drawer 1}`, or its number. The text is what the experts demonstrate: a small policy
# copies a phrase from its prompt far more reliably than it maps a phrase back to the number in front
# of it, and an answer by name means the same whatever order the list is in.
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
ANSWER_INSTRUCTION = "Think briefly, then answer with \\boxed{action}."


def _normal(text: str) -> str:
    return " ".join(text.lower().replace(".", " ").split())


def parse_choice(response: str, actions: list[str]) -> int | None:
    """Index into `actions` of the last `\\boxed{...}` in the response: a listed action's text (case,
    spacing and periods ignored) or its number. None if it names no listed action."""
    found = BOXED.findall(response)
    if not found:
        return None
    said = found[-1].strip()
    if re.fullmatch(r"-?\d+", said):
        index = int(said)
        return index if 0 <= index < len(actions) else None
    wanted = _normal(said)
    return next((i for i, text in enumerate(actions) if _normal(text) == wanted), None)


def listed_prefix(response: str, actions: list[str]) -> int:
    """How many leading characters of `response` still spell the answer of some listed action (its
    `boxed` form, counted from the last `\\boxed{`); 0 without one. An invalid answer went wrong after
    them: `\\boxed{ take apple 1 from drawer 2}` with only `take apple 1 from table 1` listed went wrong
    at `drawer`, not at `take`."""
    start = response.rfind("\\boxed{")
    if start < 0:
        return 0
    said = response[start:]
    return start + max((len(os.path.commonprefix((said, boxed(a)))) for a in actions), default=0)


def boxed(action: str) -> str:
    """The answer that plays `action`, as the experts give it. The space after the brace makes the
    answer's words the same tokens as the listed action's (a word tokenizer tells a word after a brace
    from one after a space), so the policy copies instead of translating."""
    return f"\\boxed{{ {action}}}"


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


@runtime_checkable
class UnitTestJudged(Environment, Protocol):
    """A domain whose steps the reward model judges by writing unit tests (`judged_by == "unit_tests"`):
    the test prompt, the parser, and the two checks run in the sandbox."""

    def unit_test_prompt(self, task: TaskSpec, step_response: str = "", n_tests: int = 4) -> str: ...

    def parse_unit_tests(self, text: str) -> list[tuple[str, str]]: ...

    def test_is_correct(self, task: TaskSpec, test: tuple[str, str]) -> bool:
        """Whether the task's reference solution passes a written test (the test is right)."""
        ...

    def program_passes(self, task: TaskSpec, response: str, test: tuple[str, str]) -> bool:
        """Whether the policy's answer passes one written test."""
        ...


def judged_by_unit_tests(env: Environment) -> UnitTestJudged | None:
    """`env` where the reward model writes unit tests for its steps, None where it gives verdicts; a
    domain that says unit tests without their methods is a TypeError, not a verdict domain."""
    if env.judged_by != "unit_tests":
        return None
    if not isinstance(env, UnitTestJudged):
        raise TypeError(f"{type(env).__name__} is judged by unit tests but lacks UnitTestJudged's methods")
    return env
