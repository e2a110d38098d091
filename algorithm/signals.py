"""Training targets of one complete group of judged rollouts (what the signals role publishes).

Input, plain Python: per rollout its outcome (+1/-1) and per step the m verdicts (+1/-1/0);
optionally per judgement a raw score that replaces the consistency reward (code domain: the
judge's CURE score of the unit tests it wrote). Output: which (rollout, step) become policy
samples and which (rollout, step, judgement) become reward-model samples, with their reward and
advantage. Rules (DESIGN section 2):
- policy: only groups whose accuracy lies in [policy_acc_low, policy_acc_high] (the released code's
  1/8 and 7/8: with n = 8, mixed-outcome groups only); R = integrated_rewards(outcome, verdicts, lam);
  advantages = step_advantages(R) over the group; zero advantages dropped; with episode_weighting a
  rollout's advantages are scaled by (mean rollout length / its length), so a 40-step failure does not
  outweigh a 4-step success tenfold (the loss is a mean over samples). An all-fail or
  all-success group would train on reward-model noise alone (measured: held-out success fell).
- reward model: only if lo <= group accuracy <= hi; per (rollout, step) the m raw rewards are
  consistency_raw(R, verdicts) (or the given scores) z-scored together; zero advantages dropped. The
  consistency reward pays a verdict for agreeing with the rollout's outcome, and failed rollouts run
  longer: unweighted, most samples push towards "bad" and the reward model collapsed to one verdict
  (measured), after which unanimous verdicts give it no signal at all. With rm_outcome_balance the
  steps of successful and of failed rollouts weigh the same in total (`outcome_balance`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from algorithm.rewards import (
    consistency_raw,
    format_advantages,
    integrated_rewards,
    state_advantages,
    step_advantages,
    zscore,
)
from algorithm.staleness import ZERO_ADVANTAGE_ATOL
from algorithm.tasks import HIGH, LOW, group_accuracy

POLICY_ACC_LOW = 1 / 8  # the released code's bounds on a group's accuracy for a policy step
POLICY_ACC_HIGH = 7 / 8

Scores = Sequence[Sequence[Sequence[float | None]]]  # [rollout][step][judgement]


@dataclass(frozen=True)
class PolicyTarget:
    """One policy sample: step `step` of rollout `rollout`."""

    rollout: int
    step: int
    reward: float  # integrated step reward R
    advantage: float


@dataclass(frozen=True)
class RewardTarget:
    """One reward-model sample: judgement `judgement` about step `step` of rollout `rollout`."""

    rollout: int
    step: int
    judgement: int
    reward: float  # raw reward before the z-score (R * s, -2 if invalid, or the given score)
    advantage: float


@dataclass(frozen=True)
class GroupSignals:
    accuracy: float  # fraction of the group's rollouts that succeeded
    step_rewards: list[list[float]]  # R[rollout][step], every step (also those dropped)
    policy: list[PolicyTarget]  # steps with a non-zero advantage, rollout-major order
    reward: list[RewardTarget]  # judgements with a non-zero advantage (empty if not eligible)
    reward_model_eligible: bool  # accuracy within [rm_acc_low, rm_acc_high]
    policy_eligible: bool  # accuracy within [policy_acc_low, policy_acc_high]
    policy_dropped_zero: int  # steps left out because their advantage is 0 (eligible groups)
    policy_dropped_group: int  # steps left out because the group is not policy-eligible
    reward_dropped_zero: int  # judgements left out because their advantage is 0 (eligible groups)


def group_signals(
    outcomes: Sequence[int],
    verdicts: Sequence[Sequence[Sequence[int]]],
    *,
    lam: float = 1.0,
    rm_lam: float | None = None,
    rm_acc_low: float = LOW,
    rm_acc_high: float = HIGH,
    policy_acc_low: float = POLICY_ACC_LOW,
    policy_acc_high: float = POLICY_ACC_HIGH,
    episode_weighting: bool = False,
    rm_outcome_balance: bool = False,
    scores: Scores | None = None,
    states: Sequence[Sequence[str]] | None = None,
    unjudged: Sequence[Sequence[bool]] | None = None,
    invalid: Sequence[Sequence[bool]] | None = None,
    invalid_penalty: float = 0.0,
    atol: float = ZERO_ADVANTAGE_ATOL,
) -> GroupSignals:
    """Policy and reward-model targets of a whole group.

    `outcomes[r]` is rollout r's outcome; `verdicts[r][k]` the m verdicts about its step k.
    `scores[r][k][j]`, when given and not None for every judgement of a step, is the raw reward of
    judgement j instead of the consistency reward. `rm_lam`, when given, is the λ of the step rewards
    that the consistency reward uses (the policy's keep `lam`). `states[r][k]`, when given, names what
    the policy saw at step k of rollout r, and the policy's advantages take the state as the baseline
    (`state_advantages`) instead of the step index. `unjudged[r][k]` True keeps that step's verdicts out
    of the policy's R (it is the outcome alone); the reward model still learns from them. With
    `invalid_penalty` > 0, `invalid[r][k]` True marks an invalid answer: its policy advantage is
    `-invalid_penalty` and the valid steps are scored among themselves (`format_advantages`). A target
    is kept iff |advantage| > atol.
    """
    if invalid_penalty > 0 and invalid is None:
        raise ValueError("invalid_penalty > 0 needs the invalid-answer marks (invalid=)")
    if len(outcomes) != len(verdicts):
        raise ValueError(f"{len(outcomes)} outcomes for {len(verdicts)} rollouts' verdicts")
    accuracy = group_accuracy(outcomes)
    judged_rewards = [integrated_rewards(o, v, lam) for o, v in zip(outcomes, verdicts, strict=True)]
    rm_step_rewards = judged_rewards
    step_rewards = judged_rewards
    if unjudged is not None:
        step_rewards = [[float(o) if skip else reward for reward, skip in zip(row, marks, strict=True)]
                        for o, row, marks in zip(outcomes, judged_rewards, unjudged, strict=True)]  # fmt: skip
    if rm_lam is not None and rm_lam != lam:
        rm_step_rewards = [integrated_rewards(o, v, rm_lam) for o, v in zip(outcomes, verdicts, strict=True)]
    eligible = rm_acc_low <= accuracy <= rm_acc_high
    policy_eligible = policy_acc_low <= accuracy <= policy_acc_high

    # --- policy: z-score per step index (or per state) across the group ---
    policy: list[PolicyTarget] = []
    policy_dropped = 0
    advantages: list[list[float]] = []
    if policy_eligible:
        if invalid_penalty > 0 and invalid is not None:
            advantages = format_advantages(step_rewards, invalid, invalid_penalty, states)
        elif states is None:
            advantages = step_advantages(step_rewards)
        else:
            advantages = state_advantages(step_rewards, states)
    steps = sum(len(row) for row in step_rewards)
    for r, row in enumerate(advantages):
        # episode weighting: each rollout weighs the same in total (its steps share the group's mean length)
        weight = steps / (len(step_rewards) * len(row)) if episode_weighting and row else 1.0
        for k, advantage in enumerate(row):
            advantage *= weight
            if abs(advantage) > atol:
                policy.append(PolicyTarget(r, k, step_rewards[r][k], advantage))
            else:
                policy_dropped += 1

    # --- reward model: z-score across the m judgements of each step ---
    reward: list[RewardTarget] = []
    reward_dropped = 0
    if eligible:
        weights = outcome_balance(outcomes, [len(row) for row in verdicts]) if rm_outcome_balance else None
        for r, rollout_verdicts in enumerate(verdicts):
            for k, step_verdicts in enumerate(rollout_verdicts):
                raw = _raw_step_scores(scores, r, k, len(step_verdicts))
                if raw is None:
                    raw = consistency_raw(rm_step_rewards[r][k], step_verdicts)
                scaled = [a * weights[r] for a in zscore(raw)] if weights else zscore(raw)
                for j, (value, advantage) in enumerate(zip(raw, scaled, strict=True)):
                    if abs(advantage) > atol:
                        reward.append(RewardTarget(r, k, j, value, advantage))
                    else:
                        reward_dropped += 1

    return GroupSignals(
        accuracy=accuracy,
        step_rewards=step_rewards,
        policy=policy,
        reward=reward,
        reward_model_eligible=eligible,
        policy_eligible=policy_eligible,
        policy_dropped_zero=policy_dropped,
        policy_dropped_group=0 if policy_eligible else sum(len(row) for row in step_rewards),
        reward_dropped_zero=reward_dropped,
    )


def outcome_balance(outcomes: Sequence[int], lengths: Sequence[int]) -> list[float]:
    """Per rollout, the weight that gives the steps of successful and of failed rollouts equal total
    weight (mean weight 1 over the steps): T / (2 · T_class) for a rollout whose class has T_class of the
    T steps; 1 for everyone when one class has no steps."""
    total = sum(lengths)
    won = sum(n for o, n in zip(outcomes, lengths, strict=True) if o > 0)
    lost = total - won
    if won == 0 or lost == 0:
        return [1.0] * len(outcomes)
    return [total / (2 * (won if o > 0 else lost)) for o in outcomes]


def _raw_step_scores(scores: Scores | None, r: int, k: int, m: int) -> list[float] | None:
    """The given raw scores of step k of rollout r, or None when they are absent or incomplete."""
    if scores is None or r >= len(scores) or k >= len(scores[r]):
        return None
    step_scores = scores[r][k]
    if len(step_scores) != m:
        raise ValueError(f"scores[{r}][{k}] has {len(step_scores)} values for {m} verdicts")
    if any(s is None for s in step_scores):
        return None
    return [float(s) for s in step_scores if s is not None]
