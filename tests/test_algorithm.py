"""Pure unit tests of algorithm/: hand-computed numbers for each formula, hypothesis properties."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithm import (
    accept,
    capacity,
    consistency_raw,
    consistency_rewards,
    cure_test_raw,
    cure_test_rewards,
    direction,
    filter_stale,
    first_unlisted_token,
    format_advantages,
    group_accuracy,
    groups_per_version,
    high_risk_steps,
    integrated_rewards,
    listed_conditional_loss,
    listed_token_loss,
    policy_loss,
    state_advantages,
    step_advantages,
    zscore,
)

torch.set_num_threads(1)
approx = pytest.approx
settings.register_profile("fast", max_examples=60, deadline=None)
settings.load_profile("fast")

verdict = st.sampled_from([1, -1, 0])


# --- integrated rewards: R_i = O + lam * mean(S_i) ---
def test_integrated_rewards_hand_computed() -> None:
    # step 0: 1 + (1 + 1 - 1)/3 = 1 + 1/3 = 1.3333
    # step 1: 1 + (-1 - 1 + 0)/3 = 1 - 2/3 = 0.3333   (the unparseable 0 counts in the mean)
    assert integrated_rewards(1, [[1, 1, -1], [-1, -1, 0]]) == approx([1.3333333, 0.3333333])
    # outcome -1, lam 0.5: -1 + 0.5 * 1/3 = -0.8333 ; -1 + 0.5 * (-2/3) = -1.3333
    assert integrated_rewards(-1, [[1, 1, -1], [-1, -1, 0]], lam=0.5) == approx([-0.8333333, -1.3333333])
    # lam 0 -> outcome only
    assert integrated_rewards(-1, [[1], [1]], lam=0.0) == [-1.0, -1.0]


def test_integrated_rewards_edges() -> None:
    assert integrated_rewards(1, []) == []
    with pytest.raises(ValueError, match="step 1 has no verdicts"):
        integrated_rewards(1, [[1], []])
    with pytest.raises(ValueError, match="not one of"):
        integrated_rewards(1, [[2]])


@given(st.sampled_from([1, -1]), st.lists(st.lists(verdict, min_size=1, max_size=5), max_size=8))
def test_integrated_rewards_bounded(outcome: int, verdicts: list[list[int]]) -> None:
    for r in integrated_rewards(outcome, verdicts, lam=1.0):
        assert outcome - 1 - 1e-12 <= r <= outcome + 1 + 1e-12


# --- step advantages: z-score per step index over the rollouts that reached it ---
def test_step_advantages_hand_computed() -> None:
    rewards = [[1.0, 2.0, 5.0], [3.0, 2.0], [2.0]]
    # k=0: [1, 3, 2]: mean 2, population var (1 + 1 + 0)/3 = 2/3, std 0.816497
    #      -> [-1/0.816497, +1/0.816497, 0] = [-1.224745, 1.224745, 0]
    # k=1: [2, 2]: std 0 -> [0, 0]
    # k=2: [5] reached by one rollout -> 0 (the released code would keep 5)
    assert step_advantages(rewards) == [approx([-1.224745, 0.0, 0.0]), approx([1.224745, 0.0]), [0.0]]
    # two rollouts [1, 3]: mean 2, std 1 -> [-1, 1]
    assert step_advantages([[1.0], [3.0]]) == [[-1.0], [1.0]]


def test_state_advantages_hand_computed() -> None:
    rewards = [[0.0, 2.0, 0.0], [3.0, 1.0]]
    states = [["a", "b", "c"], ["c", "a"]]
    # "a" at (0,0) and (1,1): [0, 1], mean 0.5, std 0.5 -> [-1, 1]
    # "c" at (0,2) and (1,0): [0, 3], mean 1.5, std 1.5 -> [-1, 1]; "b" seen once -> 0
    assert state_advantages(rewards, states) == [[-1.0, 0.0, -1.0], [1.0, 1.0]]
    # three visits of one state [0, 0, 3]: mean 1, std sqrt(6/3) = 1.414214 -> [-0.707107, -0.707107, 1.414214]
    assert state_advantages([[0.0, 0.0], [3.0]], [["s", "s"], ["s"]]) == [
        approx([-0.707107, -0.707107]),
        approx([1.414214]),
    ]
    with pytest.raises(ValueError, match="shape"):
        state_advantages([[1.0, 2.0]], [["a"]])


def test_format_advantages_hand_computed() -> None:
    rewards = [[1.0, 0.0, 4.0], [3.0, 5.0], [2.0, 9.0]]
    invalid = [[False, True, False], [False, False], [True, False]]
    # k=0: valid [1, 3] (rollout 2's step is invalid): mean 2, std 1 -> [-1, 1]; rollout 2 -> -penalty
    # k=1: valid [5, 9] (rollout 0's is invalid): mean 7, std 2 -> [-1, 1]; rollout 0 -> -penalty
    # k=2: [4] alone -> 0
    assert format_advantages(rewards, invalid, 0.5) == [[-1.0, -0.5, 0.0], [1.0, -1.0], [-0.5, 1.0]]
    # the state as the baseline: valid "a" steps [1, 3, 9]: mean 13/3, std 3.399346 -> [-0.980581,
    # -0.392232, 1.372813]; "b" steps [4, 5] -> [-1, 1]; the invalid steps (one "a" each) -> -penalty
    states = [["a", "a", "b"], ["a", "b"], ["a", "a"]]
    assert format_advantages(rewards, invalid, 2.0, states) == [
        approx([-0.980581, -2.0, -1.0]),
        approx([-0.392232, 1.0]),
        approx([-2.0, 1.372813]),
    ]
    with pytest.raises(ValueError, match="shape"):
        format_advantages([[1.0, 2.0]], [[False]], 1.0)


def test_step_advantages_edges() -> None:
    assert step_advantages([]) == []
    assert step_advantages([[], []]) == [[], []]
    assert step_advantages([[1.0, 2.0, 3.0]]) == [[0.0, 0.0, 0.0]]  # single rollout
    assert step_advantages([[0.5, 0.5], [0.5]]) == [[0.0, 0.0], [0.0]]  # no spread
    assert step_advantages([[1.0, 1.0 + 1e-9], [1.0, 1.0]]) == [[0.0, 0.0], [0.0, 0.0]]  # std <= 1e-8


finite = st.floats(min_value=-10, max_value=10, allow_nan=False)


@given(st.lists(st.lists(finite, max_size=6), max_size=6))
def test_step_advantages_mean_zero_per_reached_step(rewards: list[list[float]]) -> None:
    advantages = step_advantages(rewards)
    assert [len(a) for a in advantages] == [len(r) for r in rewards]
    for k in range(max((len(r) for r in rewards), default=0)):
        column = [a[k] for a in advantages if len(a) > k]
        assert math.fsum(column) == approx(0.0, abs=1e-9)
        if len(column) == 1:
            assert column == [0.0]
        elif any(column):  # z-scored: population variance 1
            assert math.fsum(x * x for x in column) / len(column) == approx(1.0, rel=1e-6)


# --- reward-model consistency rewards ---
def test_consistency_rewards_hand_computed() -> None:
    # R = 4/3, verdicts [1, 1, -1]: raw [4/3, 4/3, -4/3], mean 4/9, deviations [8/9, 8/9, -16/9],
    # var (64 + 64 + 256)/81/3 = 128/81, std sqrt(128)/9 = 1.257079 -> [1/sqrt2, 1/sqrt2, -sqrt2]
    assert consistency_rewards(4 / 3, [1, 1, -1]) == approx([0.7071068, 0.7071068, -1.4142136])
    # R = 0.5, verdicts [1, -1, 0]: raw [0.5, -0.5, -2] (invalid -> -2), mean -2/3,
    # deviations [7/6, 1/6, -4/3], var (49/36 + 1/36 + 64/36)/3 = 114/108 = 1.055556, std 1.027402
    # -> [1.166667, 0.166667, -1.333333] / 1.027402 = [1.135550, 0.162221, -1.297771]
    assert consistency_raw(0.5, [1, -1, 0]) == [0.5, -0.5, -2.0]
    assert consistency_rewards(0.5, [1, -1, 0]) == approx([1.135550, 0.162221, -1.297771], abs=1e-6)


def test_consistency_advantages_with_three_verdicts_are_the_outcomes_alone() -> None:
    # With outcomes +-1 and m = 3, R = O + lam * mean S keeps O's sign for lam < 3 (disagreeing valid
    # verdicts: |mean S| <= 1/3), and every raw triple is either two equal values and one other (the same
    # z pattern whatever the sizes) or (R, -R, -2) with mean S = 0, R = O: the reward model's advantages
    # equal those of lam = 0, so co-training teaches it the episode's outcome, never its own verdicts.
    triples = [[a, b, c] for a in (1, -1, 0) for b in (1, -1, 0) for c in (1, -1, 0)]
    for outcome in (1, -1):
        for verdicts in triples:
            alone = consistency_rewards(integrated_rewards(outcome, [verdicts], lam=0.0)[0], verdicts)
            for lam in (0.5, 1.0, 2.9):
                mixed = consistency_rewards(integrated_rewards(outcome, [verdicts], lam=lam)[0], verdicts)
                assert mixed == approx(alone, abs=1e-9), (outcome, verdicts, lam)
    # from lam = 3 on the verdicts' mean can outvote the outcome: O = -1, S = [1, 1, -1], lam 3.5 -> R = 1/6
    flipped = consistency_rewards(integrated_rewards(-1, [[1, 1, -1]], lam=3.5)[0], [1, 1, -1])
    assert flipped == approx([0.7071068, 0.7071068, -1.4142136])


def test_consistency_rewards_zero_variance() -> None:
    assert consistency_rewards(1.0, [1, 1, 1]) == [0.0, 0.0, 0.0]
    assert consistency_rewards(0.0, [1, -1, 1]) == [0.0, 0.0, 0.0]  # R = 0: raw all 0
    assert consistency_rewards(1.0, [0, 0, 0]) == [0.0, 0.0, 0.0]  # all invalid: raw all -2
    assert consistency_rewards(1.0, [1]) == [0.0]
    assert consistency_rewards(1.0, []) == []


@given(finite, st.lists(verdict, max_size=6))
def test_consistency_rewards_order_and_mean(step_reward: float, verdicts: list[int]) -> None:
    raw = consistency_raw(step_reward, verdicts)
    adv = consistency_rewards(step_reward, verdicts)
    assert math.fsum(adv) == approx(0.0, abs=1e-9)
    for i in range(len(raw)):
        for j in range(len(raw)):
            if raw[i] > raw[j] + 1e-6 and any(adv):  # a margin: rewards near 1e-300 round together
                assert adv[i] > adv[j]


# --- CURE-style unit-test rewards (code domain) ---
def test_cure_test_rewards_hand_computed() -> None:
    program_correct = [True, False, False, False]  # programs 1, 2, 3 are wrong
    test_correct = [True, True, False]
    passes = [
        [True, False, False, True],  # correct test failing wrong programs 1, 2 -> +2
        [True, True, True, True],  # correct test that catches nothing -> 0
        [False, True, False, True],  # incorrect test passing wrong programs 1, 3 -> -2
    ]
    assert cure_test_raw(test_correct, passes, program_correct) == [2.0, 0.0, -2.0]
    # mean 0, population std sqrt(8/3) = 1.632993 -> [1.224745, 0, -1.224745]
    assert cure_test_rewards(test_correct, passes, program_correct) == approx([1.224745, 0.0, -1.224745])


def test_cure_test_rewards_edges() -> None:
    assert cure_test_rewards([], [], [True, False]) == []
    assert cure_test_rewards([True], [[False, False]], [True, False]) == [0.0]  # one test
    assert cure_test_rewards([True, False], [[True], [False]], [True]) == [0.0, 0.0]  # no wrong program
    with pytest.raises(ValueError, match="passes\\[0\\] has 1 entries for 2 programs"):
        cure_test_raw([True], [[True]], [True, False])
    with pytest.raises(ValueError, match="rows"):
        cure_test_raw([True, False], [[True]], [True])


@given(st.data())
def test_cure_correct_tests_never_below_incorrect(data: st.DataObject) -> None:
    n_programs = data.draw(st.integers(0, 5))
    n_tests = data.draw(st.integers(0, 5))
    program_correct = data.draw(st.lists(st.booleans(), min_size=n_programs, max_size=n_programs))
    test_correct = data.draw(st.lists(st.booleans(), min_size=n_tests, max_size=n_tests))
    row = st.lists(st.booleans(), min_size=n_programs, max_size=n_programs)
    passes = data.draw(st.lists(row, min_size=n_tests, max_size=n_tests))
    adv = cure_test_rewards(test_correct, passes, program_correct)
    for i, ok_i in enumerate(test_correct):
        for j, ok_j in enumerate(test_correct):
            if ok_i and not ok_j:
                assert adv[i] >= adv[j] - 1e-12


# --- environment adaptation ---
def test_group_accuracy_and_direction() -> None:
    assert group_accuracy([1, -1, 1, 1]) == 0.75
    assert group_accuracy([True, False]) == 0.5
    with pytest.raises(ValueError):
        group_accuracy([])
    assert direction(0.8) == "harder"
    assert direction(1.0) == "harder"
    assert direction(0.2) == "easier"
    assert direction(0.0) == "easier"
    assert direction(0.5) is None
    assert direction(0.7, high=0.7, low=0.3) == "harder"


@pytest.mark.parametrize(
    ("kind", "acc_prev", "acc_new", "accepted"),
    [
        ("harder", 0.9, 0.5, True),
        ("harder", 0.9, 0.2, True),  # exactly the lower bound
        ("harder", 1.0, 0.95, True),
        ("harder", 0.9, 0.9, False),  # not harder
        ("harder", 0.9, 0.95, False),  # easier instead
        ("harder", 0.9, 0.1, False),  # too hard
        ("harder", 0.9, 0.0, False),  # unsolvable
        ("easier", 0.1, 0.5, True),
        ("easier", 0.1, 0.8, True),  # exactly the upper bound
        ("easier", 0.0, 0.125, True),
        ("easier", 0.1, 0.1, False),  # not easier
        ("easier", 0.1, 0.9, False),  # too easy
        ("easier", 0.2, 0.1, False),  # harder instead
        ("easier", 0.0, 0.0, False),  # still unsolvable
    ],
)
def test_accept_truth_table(kind: str, acc_prev: float, acc_new: float, accepted: bool) -> None:
    assert accept(kind, acc_prev, acc_new) is accepted  # type: ignore[arg-type]


def test_accept_rejects_unknown_direction() -> None:
    with pytest.raises(ValueError, match="harder"):
        accept(None, 0.5, 0.5)  # type: ignore[arg-type]


eighths = st.integers(0, 8).map(lambda k: k / 8)


@given(st.sampled_from(["harder", "easier"]), eighths, eighths)
def test_accept_property(kind: str, acc_prev: float, acc_new: float) -> None:
    ok = accept(kind, acc_prev, acc_new)  # type: ignore[arg-type]
    if kind == "harder":
        assert ok == (0.2 <= acc_new < acc_prev)  # 0.2 > 0, so "solvable" is implied
    else:
        assert ok == (0 < acc_new <= 0.8 and acc_new > acc_prev)
    assert not (ok and acc_new == 0)


def test_high_risk_steps() -> None:
    verdicts = [[-1, -1, -1], [-1, 1, -1], [-1, -1, -1], [0, -1, -1], []]
    assert high_risk_steps(verdicts) == [0, 2]
    assert high_risk_steps([]) == []


# --- scheduling and staleness ---
def test_capacity_hand_computed() -> None:
    # capacity(max_concurrent, running, accepted, consumed, per_version, eta)
    # ahead = 10 - 6 = 4: min(8 - 3, floor((1 + 1) * 4) - (4 + 3)) = min(5, 1) = 1
    assert capacity(8, 3, 10, 6, 4, 1) == 1
    # AReaL's form when the learner consumed exactly version * batch (version 2, batch 4: 8 groups):
    # (eta + version + 1) * 4 - (accepted + running) = 16 - 13 = 3
    assert capacity(8, 3, 10, 8, 4, 1) == 3
    # a fractional share: floor((2 + 1) * 2.5) = 7 - (ahead 2 + running 1) = 4
    assert capacity(8, 1, 12, 10, 2.5, 2) == 4
    # min(5, 8 - (20 - 2 + 3) = -13) -> 0, never negative
    assert capacity(8, 3, 20, 2, 4, 1) == 0
    # the learner counted more than the scheduler has seen settle yet: nothing is ahead, not less than nothing
    assert capacity(8, 0, 3, 5, 1, 2) == 3
    # all slots busy: min(0, ...) = 0
    assert capacity(8, 8, 0, 0, 4, 10) == 0
    # fresh start: min(4 - 0, (0 + 1) * 16 - 0) = 4
    assert capacity(4, 0, 0, 0, 16, 0) == 4


def test_groups_per_version_is_what_versions_consumed_on_average() -> None:
    assert groups_per_version(0, 0) == 1.0  # before the first version
    assert groups_per_version(7, 2) == 3.5  # 7 groups over 2 versions
    assert groups_per_version(1, 3) == 1.0  # never below one group
    assert groups_per_version(0, 4) == 1.0  # a learner that consumed nothing counted
    # a version of publish_every 4 batches takes at least 4 groups: 4 before the first version, so the
    # lockstep gate (eta 0) admits a whole version's groups: floor((0 + 1) * 4) - 0 = 4
    assert groups_per_version(0, 0, 4) == 4.0
    assert capacity(8, 0, 0, 0, groups_per_version(0, 0, 4), 0) == 4
    assert groups_per_version(9, 2, 4) == 4.5  # 9 groups over 2 versions
    assert groups_per_version(6, 2, 4) == 4.0  # 3 measured (stale drops uncounted): never below 4


def test_filter_stale() -> None:
    # current 5, eta 1: keep versions >= 4
    assert filter_stale([5, 3, 4, 1, 6], 5, 1) == ([0, 2, 4], 2)
    assert filter_stale([5, 3, 4, 1, 6], 5, 0) == ([0, 4], 3)
    assert filter_stale([], 5, 1) == ([], 0)
    with pytest.raises(ValueError):
        filter_stale([1], 1, -1)


# --- policy loss ---
def _hand_batch() -> tuple[torch.Tensor, ...]:
    prox = torch.tensor([[-1.0, -2.0, -1.0], [-1.0, -2.0, -1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    ratio = torch.tensor([[1.5, 0.9, 5.0], [1.5, 0.5, 1.0], [3.0, 3.0, 3.0]], dtype=torch.float64)
    raw_w = torch.tensor([[3.0, 0.5, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    logp = (prox + ratio.log()).requires_grad_(True)
    behav = prox - raw_w.log()  # exp(prox - behav) = raw_w
    advantages = torch.tensor([1.0, -2.0, 7.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.float64)  # sample 2: no tokens
    return logp, prox, behav, advantages, mask


def test_policy_loss_hand_computed() -> None:
    logp, prox, behav, advantages, mask = _hand_batch()
    loss, diag = policy_loss(logp, prox, behav, advantages, mask, clip=0.2, kl_coef=0.01, is_cap=2.0)
    # k3(ratio) = 1/ratio + ln(ratio) - 1: k3(1.5) = 0.666667 + 0.405465 - 1 = 0.072132,
    #   k3(0.9) = 1.111111 - 0.105361 - 1 = 0.005750, k3(0.5) = 2 - 0.693147 - 1 = 0.306853, k3(1) = 0
    # sample 0 (A = +1):
    #   t0: ratio 1.5 -> min(1.5, 1.2) = 1.2; w = min(3, 2) = 2: -2.4 + 0.01*0.072132 = -2.399279
    #   t1: ratio 0.9 inside the clip: 0.9; w = 0.5: -0.45 + 0.01*0.005750 = -0.449943
    #   t2: masked. mean = (-2.399279 - 0.449943)/2 = -1.424611
    # sample 1 (A = -2), w = 1:
    #   t0: ratio 1.5 -> min(-3, -2.4) = -3: +3 + 0.000721 = 3.000721
    #   t1: ratio 0.5 -> min(-1, 0.8*-2 = -1.6) = -1.6: +1.6 + 0.003069 = 1.603069
    #   t2: ratio 1 -> -2: +2
    #   mean = 6.603790/3 = 2.201263
    # sample 2: no response tokens, not counted.  loss = (-1.424611 + 2.201263)/2 = 0.388326
    assert loss.item() == approx(0.388326, abs=1e-6)
    # diagnostics over the 5 response tokens, ratios [1.5, 0.9, 1.5, 0.5, 1.0], weights [2, .5, 1, 1, 1]
    assert diag["clip_fraction"] == approx(3 / 5)
    assert diag["ratio_mean"] == approx(5.4 / 5)
    assert diag["is_weight_mean"] == approx(5.5 / 5)
    assert diag["is_weight_max"] == approx(2.0)
    assert diag["is_truncated_fraction"] == approx(1 / 5)
    # (0.072132 + 0.005750 + 0.072132 + 0.306853 + 0)/5 = 0.091373
    assert diag["kl"] == approx(0.091373, abs=1e-6)
    assert diag["advantage_mean"] == approx(-0.5)  # (1 - 2)/2 over samples with tokens
    assert all(isinstance(v, float) for v in diag.values())
    loss.backward()
    assert logp.grad is not None
    assert torch.all(logp.grad[mask == 0] == 0)


def test_policy_loss_reference_kl_hand_computed() -> None:
    logp, prox, behav, advantages, mask = _hand_batch()
    ref = logp.detach() - math.log(2.0)  # the current policy puts twice the reference's mass on every token
    loss, diag = policy_loss(logp, prox, behav, advantages, mask, clip=0.2, kl_coef=0.01, is_cap=2.0,
                             ref_logp=ref, ref_kl_coef=0.1)  # fmt: skip
    # k3_ref = exp(ref - logp) - (ref - logp) - 1 = 0.5 + ln 2 - 1 = 0.193147 on every token, so each
    # counted sample's token mean gains 0.1 * 0.193147 = 0.019315: 0.388326 + 0.019315 = 0.407641
    assert loss.item() == approx(0.407641, abs=1e-6)
    assert diag["ref_kl"] == approx(0.193147, abs=1e-6)
    loss.backward()
    # d/dlogp of 0.1 * k3_ref = 0.1 * (1 - exp(ref - logp)) = 0.05 per token, / 3 tokens of sample 1, / 2 samples
    plain = _hand_batch()[0]
    base, _ = policy_loss(plain, prox, behav, advantages, mask, clip=0.2, kl_coef=0.01, is_cap=2.0)
    base.backward()
    assert (logp.grad - plain.grad)[1, 0].item() == approx(0.05 / 3 / 2, abs=1e-9)
    _, without = policy_loss(logp, prox, behav, advantages, mask)
    assert without["ref_kl"] == 0.0


def test_policy_loss_token_advantages_and_empty() -> None:
    logp, prox, behav, advantages, mask = _hand_batch()
    per_token = advantages.unsqueeze(1).expand(-1, 3).clone()
    a, _ = policy_loss(logp, prox, behav, advantages, mask)
    b, _ = policy_loss(logp, prox, behav, per_token, mask)
    assert a.item() == approx(b.item())
    empty = torch.zeros(0, 4)
    loss, diag = policy_loss(empty, empty, empty, torch.zeros(0), empty)
    assert loss.item() == 0.0 and diag["kl"] == 0.0
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, prox, behav, torch.zeros(2), mask)


def test_first_unlisted_token_finds_where_an_answer_left_every_listed_one() -> None:
    listed = [[5, 6, 7, 2], [5, 6, 8, 2], [5, 9, 2], [4, 2]]
    assert first_unlisted_token([5, 6, 3, 2], listed) == (2, [7, 8])  # left "5 6" at its third token
    assert first_unlisted_token([5, 3], listed) == (1, [6, 9])
    assert first_unlisted_token([3, 5, 6], listed) == (0, [4, 5])  # wrong from the first token
    assert first_unlisted_token([5, 9, 2], listed) is None  # a listed answer
    assert first_unlisted_token([5, 6], listed) is None  # the beginning of one (cut short)
    assert first_unlisted_token([4, 2, 7], listed) is None  # past the end of the one it spelled
    assert first_unlisted_token([5, 6], []) is None


def test_listed_token_loss_hand_computed() -> None:
    """Row 0 gives the allowed tokens 1 and 2 probabilities 0.2 and 0.3 (mass 0.5), row 1 its allowed
    token 3 0.4: the loss is the mean of -log 0.5 = 0.693147 and -log 0.4 = 0.916291. Through the
    log-softmax, row 0's logit gradient is (pi - q) / 2 with q the renormalised allowed part (0, 0.4,
    0.6, 0): 0.05, -0.1, -0.15, 0.2, so the allowed tokens keep their ratio 0.2 : 0.3."""
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]])).requires_grad_(True)
    loss, mass = listed_token_loss(torch.log_softmax(logits, dim=-1), [[1, 2], [3]])
    assert loss.item() == approx((0.693147 + 0.916291) / 2, abs=1e-5)
    assert mass.tolist() == approx([0.5, 0.4]) and not mass.requires_grad
    loss.backward()
    assert logits.grad[0].tolist() == approx([0.05, -0.1, -0.15, 0.2], abs=1e-6)
    with pytest.raises(ValueError, match="row 1"):
        listed_token_loss(torch.zeros(2, 4), [[1], []])


def test_listed_conditional_loss_hand_computed() -> None:
    """One-token answers over 3 tokens of probability 1/6, 2/6, 3/6; tokens 0 and 1 are listed (mass
    0.5) and 1 was played with A = 2: the term is 2 * log 0.5 / 1 = -1.386294. A second state (mass 0.1,
    A = -1, 4 tokens) adds -1 * log 0.1 / 4 = 0.575646; the loss is their mean. With the policy loss of
    the played token, state 0's logit gradient is -A * (e_1 - q) with q the renormalised listed part (1/3,
    2/3, 0): 2/3, -2/3 and exactly 0 for the unlisted token, which the advantage no longer moves."""
    logits = torch.log(torch.tensor([1 / 6, 2 / 6, 3 / 6])).requires_grad_(True)
    logp = torch.log_softmax(logits, dim=-1)
    other = torch.tensor([math.log(0.1)], requires_grad=True)
    term, mass = listed_conditional_loss(
        [logp[[0, 1]], other], torch.tensor([2.0, -1.0]), torch.tensor([1.0, 4.0])
    )
    assert term.item() == approx((2 * math.log(0.5) - math.log(0.1) / 4) / 2, abs=1e-6)
    assert mass.tolist() == approx([0.5, 0.1]) and not mass.requires_grad
    played = logp[1].reshape(1, 1)
    pg, _ = policy_loss(
        played, played.detach(), played.detach(), torch.tensor([2.0]), torch.ones(1, 1), kl_coef=0.0
    )
    (pg + 2 * term).backward()  # term is a mean over 2 states; state 0 alone weighs 1 with pg's 1 sample
    assert logits.grad.tolist() == approx([2 / 3, -2 / 3, 0.0], abs=1e-6)
    with pytest.raises(ValueError, match="state 1"):
        listed_conditional_loss([logp[[0]], torch.zeros(0)], torch.ones(2), torch.ones(2))
    with pytest.raises(ValueError, match="one of each per sample"):
        listed_conditional_loss([logp[[0]]], torch.ones(2), torch.ones(2))


batch_shape = st.tuples(st.integers(1, 4), st.integers(1, 5))


@given(batch_shape, st.integers(0, 2**31 - 1))
def test_policy_loss_gradient_follows_advantage(shape: tuple[int, int], seed: int) -> None:
    """At ratio 1 (current == proximal) the gradient on every response token is -w*A/T_b/B_eff."""
    gen = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(shape, generator=gen, dtype=torch.float64) * 3).requires_grad_(True)
    prox = logp.detach().clone()
    behav = prox + torch.randn(shape, generator=gen, dtype=torch.float64)
    advantages = torch.randn(shape[0], generator=gen, dtype=torch.float64)
    mask = (torch.rand(shape, generator=gen) < 0.7).to(torch.float64)
    loss, _ = policy_loss(logp, prox, behav, advantages, mask)
    loss.backward()
    expected_sign = -torch.sign(advantages).unsqueeze(1) * mask
    assert torch.equal(torch.sign(logp.grad), expected_sign)


@given(batch_shape, st.integers(0, 2**31 - 1))
def test_policy_loss_gradient_never_against_advantage(shape: tuple[int, int], seed: int) -> None:
    """Without the KL term, any ratio: a step down the gradient never lowers pi where A > 0."""
    gen = torch.Generator().manual_seed(seed)
    prox = -torch.rand(shape, generator=gen, dtype=torch.float64) * 3
    logp = (prox + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.5).requires_grad_(True)
    behav = prox + torch.randn(shape, generator=gen, dtype=torch.float64)
    advantages = torch.randn(shape[0], generator=gen, dtype=torch.float64)
    mask = torch.ones(shape, dtype=torch.float64)
    loss, _ = policy_loss(logp, prox, behav, advantages, mask, kl_coef=0.0)
    loss.backward()
    assert torch.all(logp.grad * advantages.unsqueeze(1) <= 0)


def _plain_ppo_clip(logp, prox, advantages, mask, clip, kl_coef) -> float:
    """Reference: textbook PPO-clip + k3, written with Python floats, token mean then batch mean."""
    per_sample = []
    for b in range(logp.shape[0]):
        terms = []
        for t in range(logp.shape[1]):
            if mask[b, t] == 0:
                continue
            ratio = math.exp(float(logp[b, t] - prox[b, t]))
            a = float(advantages[b])
            d = float(prox[b, t] - logp[b, t])
            k3 = math.exp(d) - d - 1
            terms.append(-min(ratio * a, min(max(ratio, 1 - clip), 1 + clip) * a) + kl_coef * k3)
        if terms:
            per_sample.append(sum(terms) / len(terms))
    return sum(per_sample) / len(per_sample) if per_sample else 0.0


@given(batch_shape, st.integers(0, 2**31 - 1), st.booleans())
def test_policy_loss_on_policy_is_plain_ppo_clip(shape: tuple[int, int], seed: int, at_prox: bool) -> None:
    """behav == prox: w = 1, so the loss is PPO-clip + KL; current == prox too: KL 0, loss -mean(A)."""
    gen = torch.Generator().manual_seed(seed)
    prox = -torch.rand(shape, generator=gen, dtype=torch.float64) * 3
    logp = prox.clone() if at_prox else prox + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.4
    advantages = torch.randn(shape[0], generator=gen, dtype=torch.float64)
    mask = (torch.rand(shape, generator=gen) < 0.7).to(torch.float64)
    loss, diag = policy_loss(logp, prox, prox.clone(), advantages, mask, clip=0.2, kl_coef=0.01)
    assert loss.item() == approx(_plain_ppo_clip(logp, prox, advantages, mask, 0.2, 0.01), abs=1e-9)
    assert diag["is_truncated_fraction"] == 0.0
    if at_prox:
        counted = mask.sum(dim=1) > 0
        expected = -float(advantages[counted].mean()) if counted.any() else 0.0
        assert loss.item() == approx(expected, abs=1e-12)
        assert diag["kl"] == 0.0 and diag["clip_fraction"] == 0.0


def test_import_does_not_load_torch() -> None:
    code = "import sys, algorithm; assert 'torch' not in sys.modules; algorithm.policy_loss"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_zscore_population_std() -> None:
    # [1, 2, 3, 4]: mean 2.5, var (2.25 + 0.25 + 0.25 + 2.25)/4 = 1.25, std 1.118034
    assert zscore([1.0, 2.0, 3.0, 4.0]) == approx([-1.341641, -0.447214, 0.447214, 1.341641])
