"""Rewards and advantages of RLAnything (DESIGN section 2), as plain-Python functions.

Every z-score here uses the *population* standard deviation (divide by n) and treats a spread of
at most `STD_EPS` as no spread: the whole set then gets advantage 0. Verdicts are +1 (good step),
-1 (bad step) or 0 (the judge's answer could not be parsed).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

STD_EPS = 1e-8  # a standard deviation at or below this is treated as zero: no signal
VALID_VERDICTS = (1, -1, 0)
INVALID_VERDICT_REWARD = -2.0  # consistency reward of an unparseable judgement (paper's released code)


def zscore(values: Sequence[float]) -> list[float]:
    """(v - mean) / std with the population std; fewer than 2 values or std <= STD_EPS -> all 0."""
    n = len(values)
    if n < 2:
        return [0.0] * n
    mean = math.fsum(values) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / n)
    if std <= STD_EPS:
        return [0.0] * n
    return [(v - mean) / std for v in values]


def _check_verdicts(verdicts: Sequence[int], where: str) -> None:
    for s in verdicts:
        if s not in VALID_VERDICTS:
            raise ValueError(f"verdict {s!r} at {where} is not one of +1, -1, 0")


def integrated_rewards(outcome: float, verdicts: Sequence[Sequence[int]], lam: float = 1.0) -> list[float]:
    """Integrated step rewards of one rollout: `R_i = outcome + lam * mean(verdicts[i])`.

    `verdicts[i]` holds the m verdicts about step i; an unparseable verdict (0) counts as 0 in
    the mean (it dilutes the judges' opinion rather than being skipped). A step without any
    verdict is an error: the judge must have produced m >= 1 of them.
    """
    rewards = []
    for i, step_verdicts in enumerate(verdicts):
        if len(step_verdicts) == 0:
            raise ValueError(f"step {i} has no verdicts (m must be >= 1)")
        _check_verdicts(step_verdicts, f"step {i}")
        rewards.append(outcome + lam * math.fsum(step_verdicts) / len(step_verdicts))
    return rewards


def step_advantages(rewards: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per-step advantages of a group: `rewards[r][k]` is rollout r's reward at step k (ragged).

    For every step index k, the rewards of the rollouts that reached step k (len > k) are
    z-scored together (population std). A step index reached by a single rollout, or whose
    rewards do not spread (std <= STD_EPS), gets advantage 0. The result has the shape of
    `rewards`.
    """
    return _zscore_by_key(rewards, [list(range(len(row))) for row in rewards])


def state_advantages(
    rewards: Sequence[Sequence[float]], states: Sequence[Sequence[str]]
) -> list[list[float]]:
    """Per-step advantages of a group with the state as the baseline instead of the step index.

    `states[r][k]` names what rollout r's policy saw at step k (its prompt). The rewards of every step
    of the group that saw the same state, whatever its index, are z-scored together (population std);
    a state seen once, or whose rewards do not spread, gets advantage 0. Shape of `rewards`.
    """
    if [len(r) for r in rewards] != [len(s) for s in states]:
        raise ValueError("states must have the shape of rewards")
    return _zscore_by_key(rewards, states)


def format_advantages(
    rewards: Sequence[Sequence[float]],
    invalid: Sequence[Sequence[bool]],
    penalty: float,
    states: Sequence[Sequence[str]] | None = None,
) -> list[list[float]]:
    """Per-step advantages where an invalid answer (`invalid[r][k]`) is pushed down by a fixed
    `penalty` instead of being scored against the valid steps.

    The valid steps are z-scored among themselves by step index (or by state, given `states`), so their
    advantages sum to zero at each index and move no probability between answering validly and not; an
    invalid step gets `-penalty`. Scored against the valid steps, an invalid answer's low R hands every
    valid answer sampled at that index a positive advantage, wherever it leads. Shape of `rewards`.
    """
    if [len(r) for r in rewards] != [len(r) for r in invalid]:
        raise ValueError("invalid must have the shape of rewards")
    keys = [[("invalid", r, k) if bad else (states[r][k] if states is not None else k)
             for k, bad in enumerate(row)] for r, row in enumerate(invalid)]  # fmt: skip
    advantages = _zscore_by_key(rewards, keys)  # an invalid step's key is its own: advantage 0 there
    return [[-penalty if bad else a for a, bad in zip(adv, row, strict=True)]
            for adv, row in zip(advantages, invalid, strict=True)]  # fmt: skip


def first_unlisted_token(response: list[int], listed: list[list[int]]) -> tuple[int, list[int]] | None:
    """Where an answer first leaves every listed answer, and the tokens that would have stayed on one.

    `listed` are the state's listed answers as tokens. Returns (t, allowed): `response[:t]` begins at
    least one listed answer, `response[t]` continues none, and `allowed` (sorted) are the tokens those
    listed answers have at t. None when the answer never leaves them (it is a listed answer, or the
    beginning of one) or when nothing is listed.
    """
    candidates = [a for a in listed if a]
    for t, token in enumerate(response):
        here = [a for a in candidates if len(a) > t]
        if not here:
            return None  # past the end of every listed answer it matched: nothing to stay on
        following = [a for a in here if a[t] == token]
        if not following:
            return t, sorted({a[t] for a in here})
        candidates = following
    return None


def _zscore_by_key(
    rewards: Sequence[Sequence[float]], keys: Sequence[Sequence[Hashable]]
) -> list[list[float]]:
    """z-score together the rewards whose `keys[r][k]` are equal; shape of `rewards`."""
    at: dict[Hashable, list[tuple[int, int]]] = {}
    for r, row in enumerate(keys):
        for k, key in enumerate(row):
            at.setdefault(key, []).append((r, k))
    advantages = [[0.0] * len(r) for r in rewards]
    for places in at.values():
        for (r, k), a in zip(places, zscore([rewards[r][k] for r, k in places]), strict=True):
            advantages[r][k] = a
    return advantages


def consistency_raw(step_reward: float, verdicts: Sequence[int]) -> list[float]:
    """Raw reward-model rewards of the m verdicts about one step, before the z-score.

    A verdict s in {+1, -1} earns `step_reward * s` (agreeing with the integrated reward is good);
    an unparseable verdict (0) earns INVALID_VERDICT_REWARD (-2).
    """
    _check_verdicts(verdicts, "consistency_raw")
    return [step_reward * s if s != 0 else INVALID_VERDICT_REWARD for s in verdicts]


def consistency_rewards(step_reward: float, verdicts: Sequence[int]) -> list[float]:
    """Reward-model advantages of the m verdicts about one step: `zscore(consistency_raw(...))`.

    Zero variance (e.g. all verdicts equal, or m == 1) -> all 0.
    """
    return zscore(consistency_raw(step_reward, verdicts))


def cure_test_raw(
    test_correct: Sequence[bool], passes: Sequence[Sequence[bool]], program_correct: Sequence[bool]
) -> list[float]:
    """Raw CURE-style scores of reward-model-written unit tests (code domain), before the z-score.

    `test_correct[t]`: whether test t's expected output is right (checked by the oracle).
    `passes[t][p]`: whether program p passes test t. `program_correct[p]`: whether program p is
    right (passes the hidden tests). Only wrong programs matter:
    - a correct test scores +(number of wrong programs it fails) — it catches bugs;
    - an incorrect test scores -(number of wrong programs it passes) — it blesses bugs.
    (CURE itself also subtracts wrong programs a correct test passes; this rule does not: a correct
    test that a wrong program passes is weak, not wrong.)
    """
    if len(passes) != len(test_correct):
        raise ValueError(f"passes has {len(passes)} rows for {len(test_correct)} tests")
    wrong = [p for p, ok in enumerate(program_correct) if not ok]
    scores = []
    for t, (correct, row) in enumerate(zip(test_correct, passes, strict=True)):
        if len(row) != len(program_correct):
            raise ValueError(f"passes[{t}] has {len(row)} entries for {len(program_correct)} programs")
        if correct:
            scores.append(float(sum(1 for p in wrong if not row[p])))
        else:
            scores.append(-float(sum(1 for p in wrong if row[p])))
    return scores


def cure_test_rewards(
    test_correct: Sequence[bool], passes: Sequence[Sequence[bool]], program_correct: Sequence[bool]
) -> list[float]:
    """CURE-style advantages of unit tests: `zscore(cure_test_raw(...))` over the tests.

    Zero variance (including a single test, or no wrong program) -> all 0.
    """
    return zscore(cure_test_raw(test_correct, passes, program_correct))
