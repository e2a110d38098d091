"""Environment adaptation rules (DESIGN section 2): accuracy, direction, acceptance, critic feedback."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

Direction = Literal["harder", "easier"]

HIGH = 0.8  # accuracy at or above which a task is too easy: ask for a harder variant
LOW = 0.2  # accuracy at or below which a task is too hard: ask for an easier variant


def group_accuracy(outcomes: Sequence[float]) -> float:
    """Fraction of a task's rollouts that succeeded (outcome > 0; outcomes are +1/-1 or bools)."""
    if len(outcomes) == 0:
        raise ValueError("group_accuracy of no rollouts is undefined")
    return sum(1 for o in outcomes if o > 0) / len(outcomes)


def direction(acc: float, high: float = HIGH, low: float = LOW) -> Direction | None:
    """acc >= high -> "harder"; acc <= low -> "easier"; otherwise None (the task is about right)."""
    if acc >= high:
        return "harder"
    if acc <= low:
        return "easier"
    return None


def accept(
    direction: Direction, acc_prev: float, acc_new: float, high: float = HIGH, low: float = LOW
) -> bool:
    """Acceptance of a proposed variant from its measured accuracy `acc_new`.

    Accepted iff acc_new > 0 and
    - harder: acc_new < acc_prev and acc_new >= low  (really harder, but not hopeless);
    - easier: acc_new > acc_prev and acc_new <= high (really easier, but not trivial).
    """
    if direction == "harder":
        return acc_new > 0 and acc_new < acc_prev and acc_new >= low
    if direction == "easier":
        return acc_new > 0 and acc_new > acc_prev and acc_new <= high
    raise ValueError(f"direction must be 'harder' or 'easier', got {direction!r}")


def high_risk_steps(verdicts: Sequence[Sequence[int]]) -> list[int]:
    """Indices of the steps that every verdict judged -1 (`verdicts[i]` holds step i's m verdicts).

    A step without verdicts is not high-risk (nobody judged it).
    """
    return [i for i, step in enumerate(verdicts) if len(step) > 0 and all(s == -1 for s in step)]
