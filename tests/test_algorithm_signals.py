"""algorithm.signals.group_signals on a hand-computed group."""

from __future__ import annotations

import pytest

from algorithm import GroupSignals, PolicyTarget, RewardTarget, group_signals
from algorithm.signals import outcome_balance

approx = pytest.approx

# Four rollouts, m = 2 verdicts per step, lam = 1.  R = O + mean(S):
#   r0: O=+1, [[1, 1], [1, -1]]           -> R = [2, 1]
#   r1: O=-1, [[1, -1], [-1, -1], [0, -1]] -> R = [-1, -2, -1.5]
#   r2: O=+1, [[1, 1]]                     -> R = [2]
#   r3: O=-1, [[-1, -1], [1, 1]]           -> R = [-2, 0]
OUTCOMES = [1, -1, 1, -1]
VERDICTS = [
    [[1, 1], [1, -1]],
    [[1, -1], [-1, -1], [0, -1]],
    [[1, 1]],
    [[-1, -1], [1, 1]],
]


def test_group_signals_hand_computed() -> None:
    signals = group_signals(OUTCOMES, VERDICTS)
    assert isinstance(signals, GroupSignals)
    assert signals.accuracy == 0.5 and signals.reward_model_eligible
    assert signals.step_rewards == [[2.0, 1.0], [-1.0, -2.0, -1.5], [2.0], [-2.0, 0.0]]

    # step 0: [2, -1, 2, -2], mean 0.25, deviations [1.75, -1.25, 1.75, -2.25],
    #   var (3.0625 + 1.5625 + 3.0625 + 5.0625)/4 = 3.1875, std 1.785357
    #   -> [0.980196, -0.700140, 0.980196, -1.260252]
    # step 1: [1, -2, 0] (r0, r1, r3), mean -1/3, deviations [4/3, -5/3, 1/3], var 14/9,
    #   std sqrt(14)/3 = 1.247219 -> [1.069045, -1.336306, 0.267261]
    # step 2: reached by r1 only -> 0, dropped
    expected_policy = [
        (0, 0, 2.0, 0.980196),
        (0, 1, 1.0, 1.069045),
        (1, 0, -1.0, -0.700140),
        (1, 1, -2.0, -1.336306),
        (2, 0, 2.0, 0.980196),
        (3, 0, -2.0, -1.260252),
        (3, 1, 0.0, 0.267261),
    ]
    assert [(p.rollout, p.step, p.reward) for p in signals.policy] == [e[:3] for e in expected_policy]
    assert [p.advantage for p in signals.policy] == approx([e[3] for e in expected_policy], abs=1e-6)
    assert signals.policy_dropped_zero == 1

    # reward model, raw = R * s (invalid -> -2), z-scored over the 2 judgements of a step:
    #   r0 k0: R=2,  [1, 1]   -> [2, 2]    no spread, both dropped
    #   r0 k1: R=1,  [1, -1]  -> [1, -1]   -> [1, -1]
    #   r1 k0: R=-1, [1, -1]  -> [-1, 1]   -> [-1, 1]
    #   r1 k1: R=-2, [-1, -1] -> [2, 2]    dropped
    #   r1 k2: R=-1.5, [0, -1] -> [-2, 1.5]: mean -0.25, deviations -/+1.75 -> [-1, 1]
    #   r2 k0, r3 k0: [2, 2]; r3 k1: R=0 -> [0, 0]: dropped  => 10 dropped, 6 kept
    assert signals.reward == [
        RewardTarget(0, 1, 0, 1.0, 1.0),
        RewardTarget(0, 1, 1, -1.0, -1.0),
        RewardTarget(1, 0, 0, -1.0, -1.0),
        RewardTarget(1, 0, 1, 1.0, 1.0),
        RewardTarget(1, 2, 0, -2.0, -1.0),
        RewardTarget(1, 2, 1, 1.5, 1.0),
    ]
    assert signals.reward_dropped_zero == 10


def test_state_baseline_compares_steps_that_saw_the_same_prompt() -> None:
    # R as above. States: r0 [a, b], r1 [a, c, b], r2 [d], r3 [a, b].
    # a: [2, -1, -2] (r0 k0, r1 k0, r3 k0), mean -1/3, deviations [7/3, -2/3, -5/3], var 78/27,
    #   std 1.699673 -> [1.372813, -0.392232, -0.980581]
    # b: [1, -1.5, 0] (r0 k1, r1 k2, r3 k1), mean -1/6, deviations [7/6, -4/3, 1/6], var 114/108,
    #   std 1.027402 -> [1.135550, -1.297771, 0.162221]
    # c and d seen once -> 0, dropped
    signals = group_signals(OUTCOMES, VERDICTS, states=[["a", "b"], ["a", "c", "b"], ["d"], ["a", "b"]])
    got = [(t.rollout, t.step, t.reward, t.advantage) for t in signals.policy]
    assert got == [
        (0, 0, 2.0, approx(1.372813)),
        (0, 1, 1.0, approx(1.135550)),
        (1, 0, -1.0, approx(-0.392232)),
        (1, 2, -1.5, approx(-1.297771)),
        (3, 0, -2.0, approx(-0.980581)),
        (3, 1, 0.0, approx(0.162221, abs=1e-6)),
    ]
    assert signals.policy_dropped_zero == 2


def test_unjudged_steps_get_the_outcome_alone_in_the_policys_reward() -> None:
    # r1's step 1 unjudged: its R is O = -1 instead of -2. Step 1: [1, -1, 0] (r0, r1, r3), mean 0,
    # var 2/3, std 0.816497 -> [1.224745, -1.224745, 0 (dropped)]; step 0 and the reward model unchanged
    unjudged = [[False, False], [False, True, False], [False], [False, False]]
    signals = group_signals(OUTCOMES, VERDICTS, unjudged=unjudged)
    plain = group_signals(OUTCOMES, VERDICTS)
    assert signals.step_rewards[1] == [-1.0, -1.0, -1.5]
    step_1 = [(t.rollout, t.advantage) for t in signals.policy if t.step == 1]
    assert step_1 == [(0, approx(1.224745)), (1, approx(-1.224745))]
    assert [t for t in signals.policy if t.step == 0] == [t for t in plain.policy if t.step == 0]
    assert signals.reward == plain.reward


def test_an_invalid_penalty_needs_the_invalid_marks() -> None:
    with pytest.raises(ValueError, match="invalid="):
        group_signals(OUTCOMES, VERDICTS, invalid_penalty=1.0)


def test_reward_model_lambda_lets_the_verdicts_outvote_the_outcome() -> None:
    """rm_lam changes only the reward model's consistency reward: with m = 3 and λ = 1 a failed
    rollout's 2-1 "good" majority is taught "bad" (the outcome); with rm_lam 3.5 the majority wins."""
    outcomes, verdicts = [1, -1], [[[1, -1, -1]], [[1, 1, -1]]]
    # λ = 1: r0 R = 1 - 1/3 = 2/3, raw [2/3, -2/3, -2/3]; r1 R = -1 + 1/3 = -2/3, raw [-2/3, -2/3, 2/3];
    #   z of (a, a, b): a' = +-1/sqrt2, b' = -+sqrt2 -> the lone verdict agreeing with the outcome wins in r1
    paper = group_signals(outcomes, verdicts)
    assert [t.advantage for t in paper.reward] == approx([1.4142136, -0.7071068, -0.7071068,
                                                           -0.7071068, -0.7071068, 1.4142136])  # fmt: skip
    # rm_lam 3.5: r0 R = 1 - 3.5/3 = -1/6 (raw [-1/6, 1/6, 1/6]), r1 R = -1 + 3.5/3 = 1/6 ([1/6, 1/6, -1/6]):
    #   the majority's verdicts win in both rollouts, whatever the outcome
    own = group_signals(outcomes, verdicts, rm_lam=3.5)
    assert [t.advantage for t in own.reward] == approx([-1.4142136, 0.7071068, 0.7071068,
                                                         0.7071068, 0.7071068, -1.4142136])  # fmt: skip
    assert [t.reward for t in own.reward] == approx([-1 / 6, 1 / 6, 1 / 6, 1 / 6, 1 / 6, -1 / 6])
    # the policy's rewards and advantages keep λ = 1
    assert own.step_rewards == paper.step_rewards == [[approx(2 / 3)], [approx(-2 / 3)]]
    assert [p.advantage for p in own.policy] == [p.advantage for p in paper.policy] == approx([1.0, -1.0])


def test_group_signals_accuracy_filter() -> None:
    # all succeed: accuracy 1 > 0.8, no reward-model samples, and (released code: 7/8) no policy samples
    signals = group_signals([1, 1], [[[1, 1]], [[1, -1]]])
    assert not signals.reward_model_eligible and signals.reward == []
    assert not signals.policy_eligible and signals.policy == [] and signals.policy_dropped_group == 2
    # opened to every group, the policy learns from the verdicts: R = [2], [1] -> mean 1.5, std 0.5 -> [+1, -1]
    opened = group_signals([1, 1], [[[1, 1]], [[1, -1]]], policy_acc_low=0.0, policy_acc_high=1.0)
    assert opened.policy == [PolicyTarget(0, 0, 2.0, 1.0), PolicyTarget(1, 0, 1.0, -1.0)]
    assert opened.policy_dropped_group == 0
    # n = 8: 1/8 and 7/8 are in (inclusive bounds), 0/8 and 8/8 are out; all-fail with split verdicts too
    one_of_eight = group_signals([1] + [-1] * 7, [[[1, 1]]] + [[[1, -1]]] * 7)
    assert one_of_eight.policy_eligible and len(one_of_eight.policy) == 8
    seven_of_eight = group_signals([1] * 7 + [-1], [[[1, 1]]] * 8)
    assert seven_of_eight.policy_eligible and len(seven_of_eight.policy) == 8
    all_fail = group_signals([-1] * 8, [[[1, 1]]] * 4 + [[[-1, -1]]] * 4)
    assert not all_fail.policy_eligible and all_fail.policy == [] and all_fail.policy_dropped_group == 8
    # bounds are inclusive: 1 success of 5 = 0.2
    low = group_signals([1, -1, -1, -1, -1], [[[1, -1]]] * 5)
    assert low.accuracy == 0.2 and low.reward_model_eligible
    narrow = group_signals(OUTCOMES, VERDICTS, rm_acc_low=0.6)
    assert not narrow.reward_model_eligible and narrow.reward == []


def test_group_signals_lam_and_scores() -> None:
    # lam = 0: R = outcome only -> step 0 [1, -1, 1, -1] -> [+1, -1, +1, -1]; step 1 [1, -1, -1]:
    #   mean -1/3, std sqrt(8/9) = 0.942809 -> [1.414214, -0.707107, -0.707107]
    signals = group_signals(OUTCOMES, VERDICTS, lam=0.0)
    assert [p.advantage for p in signals.policy] == approx(
        [1.0, 1.414214, -1.0, -0.707107, 1.0, -1.0, -0.707107], abs=1e-6
    )
    # code domain: given scores replace R * s for a step whose judgements all have one
    scores = [
        [[None, None], [3.0, 1.0]],
        [[None, None], [5.0, 5.0], [None, 1.0]],
        [[None, None]],
        [[None, None]] * 2,
    ]
    scored = group_signals(OUTCOMES, VERDICTS, scores=scores)
    by_step = {(t.rollout, t.step, t.judgement): (t.reward, t.advantage) for t in scored.reward}
    assert by_step[(0, 1, 0)] == (3.0, 1.0) and by_step[(0, 1, 1)] == (1.0, -1.0)
    assert (1, 1, 0) not in by_step  # equal scores: no spread
    assert by_step[(1, 2, 0)] == (-2.0, -1.0)  # incomplete scores: falls back to consistency reward
    with pytest.raises(ValueError, match="scores\\[0\\]\\[0\\] has 1 values for 2 verdicts"):
        group_signals(OUTCOMES, VERDICTS, scores=[[[1.0]]])


def test_group_signals_edges() -> None:
    single = group_signals([1], [[[1, -1], [1, 1]]], policy_acc_high=1.0)  # one rollout: no policy signal
    assert single.policy == [] and single.policy_dropped_zero == 2
    assert single.accuracy == 1.0 and single.reward == []
    empty_steps = group_signals([1, -1], [[], []])
    assert empty_steps.policy == [] and empty_steps.reward == [] and empty_steps.accuracy == 0.5
    with pytest.raises(ValueError, match="2 outcomes for 1 rollouts"):
        group_signals([1, -1], [[]])
    with pytest.raises(ValueError):
        group_signals([], [])


def test_episode_weighting_scales_each_rollout_to_the_mean_length() -> None:
    # 8 steps over 4 rollouts (lengths 2, 3, 1, 2): mean length 2; weights 1, 2/3, 2, 1
    plain = group_signals(OUTCOMES, VERDICTS)
    weighted = group_signals(OUTCOMES, VERDICTS, episode_weighting=True)
    weights = {0: 1.0, 1: 2 / 3, 2: 2.0, 3: 1.0}
    assert [(p.rollout, p.step) for p in weighted.policy] == [(p.rollout, p.step) for p in plain.policy]
    assert [p.advantage for p in weighted.policy] == approx(
        [p.advantage * weights[p.rollout] for p in plain.policy]
    )
    # r1 step 0: -0.700140 * 2/3 = -0.466760; r2 step 0: 0.980196 * 2 = 1.960392
    assert weighted.policy[2].advantage == approx(-0.466760, abs=1e-6)
    assert weighted.policy[4].advantage == approx(1.960392, abs=1e-6)


def test_reward_samples_balance_successful_and_failed_steps() -> None:
    # One 1-step success and one 3-step failure, m = 2 split verdicts on every step.
    # success step: R = 1 + 0 = 1, raw [1, -1] -> z [1, -1]: pushes "good"
    # failure steps: R = -1, raw [-1, 1] -> z [-1, 1]: each pushes "bad"
    outcomes, verdicts = [1, -1], [[[1, -1]], [[1, -1]] * 3]
    plain = group_signals(outcomes, verdicts, rm_acc_low=0.0, rm_acc_high=1.0)

    def push(signals) -> dict[int, float]:  # total advantage on each verdict value
        out = {1: 0.0, -1: 0.0}
        for t in signals.reward:
            if t.advantage > 0:
                out[verdicts[t.rollout][t.step][t.judgement]] += t.advantage
        return out

    assert push(plain) == {1: approx(1.0), -1: approx(3.0)}  # 3:1 for "bad": the collapse
    balanced = group_signals(outcomes, verdicts, rm_acc_low=0.0, rm_acc_high=1.0, rm_outcome_balance=True)
    # T = 4 steps: success weight 4 / (2 * 1) = 2, failure weight 4 / (2 * 3) = 2/3
    assert push(balanced) == {1: approx(2.0), -1: approx(2.0)}
    assert [t.reward for t in balanced.reward] == [t.reward for t in plain.reward]  # raw rewards unchanged


def test_outcome_balance_weights() -> None:
    assert outcome_balance([1, -1, -1], [2, 3, 5]) == approx([2.5, 0.625, 0.625])  # 10 / (2*2), 10 / (2*8)
    assert outcome_balance([-1, -1], [2, 3]) == [1.0, 1.0]
