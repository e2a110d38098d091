"""signals: hand-built judged groups -> exact samples; duplicates; pending variants; watermark."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest
from aiokafka.partitioner import murmur2

from consumers import archive, signals
from infra.bus import Bus, Record
from pipeline.groups import RolloutGroup, complete_groups
from pipeline.samples import build_samples
from schemas import topics
from schemas.config import RunConfig, SignalsConfig
from schemas.events import (
    JudgedTrajectory,
    Judgement,
    Metric,
    RejectedAnswer,
    Step,
    StepJudgement,
    TaskSpec,
    Trajectory,
)
from tests.conftest import eventually, wait_records

TASK = TaskSpec(task_id="t-base", domain="arith", difficulty=0, params={}, seed=1)


def judged(
    request_id: str, rollout: int, size: int, outcome: int, verdicts: list[list[int]], task: TaskSpec = TASK
) -> JudgedTrajectory:
    """A judged rollout whose step k has the given verdicts; token ids encode (rollout, step, judgement)."""
    steps = [
        Step(
            index=k,
            prompt="p",
            response="r",
            prompt_token_ids=[rollout, k],
            response_token_ids=[100 + rollout, 100 + k],
            behaviour_logprobs=[-0.5, -0.25],
            policy_version=3,
        )
        for k in range(len(verdicts))
    ]
    step_judgements = [
        StepJudgement(
            step_index=k,
            judgements=[
                Judgement(
                    verdict=v,
                    prompt_token_ids=[rollout, k, j],
                    response_token_ids=[7, j],
                    behaviour_logprobs=[-1.0, -2.0],
                )
                for j, v in enumerate(vs)
            ],
        )
        for k, vs in enumerate(verdicts)
    ]
    trajectory = Trajectory(
        request_id=request_id, rollout_index=rollout, group_size=size, task=task, steps=steps, outcome=outcome
    )
    return JudgedTrajectory(trajectory=trajectory, steps=step_judgements, reward_version=2)


# Group A (n=3, λ=1, m=2). R = O + mean(S):
#   rollout 0: O=+1, S=[1,1],[1,-1],[1,1]  -> R = [2, 1, 2]
#   rollout 1: O=-1, S=[1,1],[-1,-1]       -> R = [0, -2]
#   rollout 2: O=-1, S=[-1,0]              -> R = [-1.5]
# step 0: [2, 0, -1.5], mean 1/6, pop. var (121/36 + 1/36 + 100/36)/3 = 222/108, std 1.433721...
#   -> advantages 1.833333/std = 1.278724, -0.166667/std = -0.116248, -1.666667/std = -1.162476
# step 1: [1, -2], mean -0.5, std 1.5 -> +1, -1
# step 2: reached by rollout 0 only -> 0 -> dropped
A_POLICY = {
    "A/0/0": (2.0, 1.278724),
    "A/1/0": (0.0, -0.116248),
    "A/2/0": (-1.5, -1.162476),
    "A/0/1": (1.0, 1.0),
    "A/1/1": (-2.0, -1.0),
}
# Reward model (accuracy 1/3 in [0.2, 0.8]): raw = R*s (invalid verdict -2), z-scored over m=2:
#   (0,1): R=1, S=[1,-1] -> raw [1,-1] -> [+1,-1];  (2,0): R=-1.5, S=[-1,0] -> raw [1.5,-2] -> [+1,-1]
#   every other step has equal raws -> advantage 0 -> dropped
A_REWARD = {"A/0/1/0": (1.0, 1.0), "A/0/1/1": (-1.0, -1.0), "A/2/0/0": (1.5, 1.0), "A/2/0/1": (-2.0, -1.0)}
# Group B (n=2, both succeed): R = [2], [1] -> advantages +1, -1; accuracy 1.0 -> no reward samples.
B_POLICY = {"B/0/0": (2.0, 1.0), "B/1/0": (1.0, -1.0)}
# The numbers above leave each sample's advantage as it is (episode weighting off) and use the paper's one λ
# for the reward model too (rm_lam = lam = 1; the default 3.5 is checked in test_default_weighs_...).
UNWEIGHTED = SignalsConfig(episode_weighting=False, rm_lam=1.0)
# The role tests open the policy group filter (default: accuracy in [1/8, 7/8]) so that B trains.
OPEN = SignalsConfig(group_timeout_s=60.0, policy_acc_low=0.0, policy_acc_high=1.0, episode_weighting=False,
                     rm_lam=1.0)  # fmt: skip


def group_a() -> list[JudgedTrajectory]:
    return [
        judged("A", 0, 3, 1, [[1, 1], [1, -1], [1, 1]]),
        judged("A", 1, 3, -1, [[1, 1], [-1, -1]]),
        judged("A", 2, 3, -1, [[-1, 0]]),
    ]


def group_b(request_id: str = "B", task: TaskSpec = TASK) -> list[JudgedTrajectory]:
    return [judged(request_id, 0, 2, 1, [[1, 1]], task), judged(request_id, 1, 2, 1, [[1, -1]], task)]


def test_complete_groups_count_each_rollout_once_and_order_by_index() -> None:
    a, b = group_a(), group_b()
    late = judged("C", 1, 2, 1, [[1, 1]])  # C never completes
    copy = judged("A", 1, 3, 1, [[1, 1]])  # a redelivered rollout 1 of A (first copy wins)
    groups, incomplete = complete_groups([a[2], b[1], copy, late, a[0], a[1], b[0]])
    assert sorted(groups) == ["A", "B"] and incomplete == 1
    assert [j.trajectory.rollout_index for j in groups["A"]] == [0, 1, 2]
    assert groups["A"][1] is copy and groups["B"] == b
    group = RolloutGroup("A", 3)
    assert [group.add(j) for j in (a[0], a[0], a[1])] == [True, False, True] and not group.complete
    assert group.add(a[2]) and group.complete and group.ordered() == a


def test_build_samples_matches_hand_computed_numbers() -> None:
    group = signals.Group("A", 3, TASK, opened_at=0.0)
    group.rollouts = {j.trajectory.rollout_index: j for j in group_a()}
    policy, reward, _ = build_samples(group.request_id, group.ordered(), UNWEIGHTED)
    assert {s.sample_key: (s.reward, round(s.advantage, 6)) for s in policy.samples} == A_POLICY
    assert {s.sample_key: (s.reward, round(s.advantage, 6)) for s in reward.samples} == A_REWARD
    first = next(s for s in policy.samples if s.sample_key == "A/2/0")
    assert (first.prompt_token_ids, first.response_token_ids, first.policy_version) == ([2, 0], [102, 100], 3)
    rm = next(s for s in reward.samples if s.sample_key == "A/2/0/1")
    assert (rm.prompt_token_ids, rm.reward_version) == ([2, 0, 1], 2)


def test_state_baseline_compares_every_step_from_the_same_prompt() -> None:
    """baseline "state": every step of group A saw prompt "p", so all six R = [2, 1, 2], [0, -2], [-1.5]
    are z-scored together: mean 0.25, population var 14.875 / 6, std 1.574537, and step (0, 2), which
    the step index drops (reached by one rollout), trains too."""
    group = signals.Group("A", 3, TASK, opened_at=0.0)
    group.rollouts = {j.trajectory.rollout_index: j for j in group_a()}
    config = SignalsConfig(episode_weighting=False, rm_lam=1.0, baseline="state")
    policy, reward, _ = build_samples(group.request_id, group.ordered(), config)
    assert {s.sample_key: (s.reward, round(s.advantage, 6)) for s in policy.samples} == {
        "A/0/0": (2.0, 1.111438),
        "A/0/1": (1.0, 0.476331),
        "A/0/2": (2.0, 1.111438),
        "A/1/0": (0.0, -0.158777),
        "A/1/1": (-2.0, -1.428992),
        "A/2/0": (-1.5, -1.111438),
    }
    assert {s.sample_key: (s.reward, round(s.advantage, 6)) for s in reward.samples} == A_REWARD  # unchanged


def test_verdicts_on_invalid_answers_can_stay_out_of_the_policys_reward() -> None:
    """judge_invalid_steps False: rollout 1's step 1, an invalid answer, gets R = O = -1 instead of -2."""
    rollouts = group_a()
    steps = list(rollouts[1].trajectory.steps)
    steps[1] = msgspec.structs.replace(steps[1], valid_action=False)
    rollouts[1] = msgspec.structs.replace(
        rollouts[1], trajectory=msgspec.structs.replace(rollouts[1].trajectory, steps=steps)
    )
    config = SignalsConfig(episode_weighting=False, rm_lam=1.0, judge_invalid_steps=False)
    policy, reward, signals_ = build_samples("A", rollouts, config)
    assert signals_.step_rewards[1] == [0.0, -1.0]
    assert {s.sample_key: s.reward for s in policy.samples}["A/1/1"] == -1.0
    assert {s.sample_key: (s.reward, round(s.advantage, 6)) for s in reward.samples} == A_REWARD  # unchanged


def test_invalid_draws_passed_over_are_pushed_down_by_the_penalty_alone() -> None:
    """An actor that redrew (actor.redraw > 1) keeps the invalid draws it passed over on the step. With
    invalid_penalty 1 each becomes a policy sample of advantage -1, from the tokens after its listed
    prefix; the played steps' samples are the same as without them; with no penalty they train nothing."""
    rollouts = group_a()
    steps = list(rollouts[0].trajectory.steps)
    draws = [
        RejectedAnswer(
            response_token_ids=[7, 8, 9], behaviour_logprobs=[-0.5, -1.0, -2.0], listed_prefix_tokens=2
        ),
        RejectedAnswer(response_token_ids=[7], behaviour_logprobs=[-0.25]),
    ]
    steps[1] = msgspec.structs.replace(steps[1], rejected=draws)
    rollouts[0] = msgspec.structs.replace(
        rollouts[0], trajectory=msgspec.structs.replace(rollouts[0].trajectory, steps=steps)
    )
    config = SignalsConfig(episode_weighting=False, rm_lam=1.0, invalid_penalty=1.0)
    without = build_samples("A", group_a(), config)[0].samples
    policy = build_samples("A", rollouts, config)[0].samples
    extra = {s.sample_key for s in policy} - {s.sample_key for s in without}
    assert extra == {"A/0/1/r0", "A/0/1/r1"}
    drawn = {s.sample_key: s for s in policy if s.sample_key in extra}
    assert [(s.advantage, s.reward, s.advantage_from) for s in drawn.values()] == [
        (-1.0, -1.0, 2),
        (-1.0, -1.0, 0),
    ]
    first = drawn["A/0/1/r0"]
    assert (first.prompt_token_ids, first.response_token_ids, first.behaviour_logprobs) == (
        steps[1].prompt_token_ids,
        [7, 8, 9],
        [-0.5, -1.0, -2.0],
    )
    assert first.policy_version == steps[1].policy_version
    assert [s for s in policy if s.sample_key not in extra] == list(without)
    whole = SignalsConfig(
        episode_weighting=False, rm_lam=1.0, invalid_penalty=1.0, invalid_penalty_tokens="all"
    )
    assert {s.advantage_from for s in build_samples("A", rollouts, whole)[0].samples} == {0}
    no_penalty = SignalsConfig(episode_weighting=False, rm_lam=1.0)
    assert [s.sample_key for s in build_samples("A", rollouts, no_penalty)[0].samples] == [
        s.sample_key for s in build_samples("A", group_a(), no_penalty)[0].samples
    ]


def test_invalid_answers_carry_where_they_left_the_listed_answers() -> None:
    """With a step's listed answers and the listed-token loss on, its played invalid answer and each
    draw passed over carry the token where they left every listed answer and the tokens that would
    have stayed on one; a valid answer carries none; the draws are kept at penalty 0, advantage 0."""
    rollouts = group_a()
    steps = list(rollouts[0].trajectory.steps)
    listed = [[3, 4, 2], [3, 5, 2], [6, 2]]
    draws = [
        RejectedAnswer(response_token_ids=[6, 9], behaviour_logprobs=[-0.5, -1.0]),
        RejectedAnswer(response_token_ids=[8], behaviour_logprobs=[-0.25]),
    ]
    steps[0] = msgspec.structs.replace(steps[0], listed_answers=listed)  # valid, as played
    steps[1] = msgspec.structs.replace(steps[1], valid_action=False, response_token_ids=[3, 7],
                                       behaviour_logprobs=[-0.1, -0.2], rejected=draws,
                                       listed_answers=listed)  # fmt: skip
    rollouts[0] = msgspec.structs.replace(
        rollouts[0], trajectory=msgspec.structs.replace(rollouts[0].trajectory, steps=steps)
    )
    policy = {
        s.sample_key: s
        for s in build_samples(
            "A",
            rollouts,
            SignalsConfig(episode_weighting=False),
            listed_token_loss=True,
            listed_conditional=True,
        )[0].samples
    }
    assert {"A/0/0", "A/0/1"} <= set(policy)
    left = {key: (s.unlisted_at, s.listed_tokens) for key, s in policy.items() if s.listed_tokens}
    assert left == {"A/0/1": (1, [4, 5]), "A/0/1/r0": (1, [2]), "A/0/1/r1": (0, [3, 6])}
    assert [(policy[k].advantage, policy[k].reward) for k in ("A/0/1/r0", "A/0/1/r1")] == [(0.0, 0.0)] * 2
    # the played valid answer carries its state's listed answers (the listed-conditional term); invalid
    # answers, played or passed over, were not drawn from the policy conditioned on naming one
    assert {key: s.listed_answers for key, s in policy.items() if s.listed_answers} == {"A/0/0": listed}
    # without that loss the draws would train nothing at penalty 0: not kept, the played answers are
    without = build_samples("A", rollouts, SignalsConfig(episode_weighting=False))[0].samples
    assert sorted(s.sample_key for s in without) == sorted(k for k in policy if "/r" not in k)
    # and without the listed-conditional term no sample carries the listed answers
    assert not any(s.listed_answers for s in without)


def test_an_invalid_penalty_pushes_invalid_answers_down_and_scores_valid_steps_among_themselves() -> None:
    """invalid_penalty 1: rollout 1's step 1 (an invalid answer) gets advantage -1; step index 1 then has
    one valid step (rollout 0's R = 1), which alone has no baseline and trains nothing (it got +1 against
    the invalid step's -2 before). Step 0 is as without it: R [2, 0, -1.5], mean 1/6, std 1.433721."""
    rollouts = group_a()
    steps = list(rollouts[1].trajectory.steps)
    steps[1] = msgspec.structs.replace(steps[1], valid_action=False)
    rollouts[1] = msgspec.structs.replace(
        rollouts[1], trajectory=msgspec.structs.replace(rollouts[1].trajectory, steps=steps)
    )
    steps[1] = msgspec.structs.replace(steps[1], listed_prefix_tokens=1)
    rollouts[1] = msgspec.structs.replace(
        rollouts[1], trajectory=msgspec.structs.replace(rollouts[1].trajectory, steps=steps)
    )
    config = SignalsConfig(episode_weighting=False, rm_lam=1.0, invalid_penalty=1.0)
    policy, reward, _ = build_samples("A", rollouts, config)
    # the penalty starts after the tokens that still spelled a listed action; every other sample trains whole
    assert {s.sample_key: s.advantage_from for s in policy.samples if s.advantage_from} == {"A/1/1": 1}
    whole = SignalsConfig(
        episode_weighting=False, rm_lam=1.0, invalid_penalty=1.0, invalid_penalty_tokens="all"
    )
    assert all(s.advantage_from == 0 for s in build_samples("A", rollouts, whole)[0].samples)
    assert {s.sample_key: (s.reward, round(s.advantage, 6)) for s in policy.samples} == {
        "A/0/0": (2.0, 1.278724),
        "A/1/0": (0.0, -0.116248),
        "A/2/0": (-1.5, -1.162476),
        "A/1/1": (-2.0, -1.0),
    }
    assert {s.sample_key: (s.reward, round(s.advantage, 6)) for s in reward.samples} == A_REWARD  # unchanged


def test_default_weighs_every_episode_the_same() -> None:
    """Episode weighting (the default): a rollout's advantages times 6 steps / (3 rollouts * its length),
    so rollouts of 3, 2 and 1 steps get weights 2/3, 1 and 2; rewards unchanged. The reward model's R uses
    rm_lam 3.5 (the default): the same samples survive, (2,0)'s raw reward is R = -1 + 3.5 * (-0.5) = -2.75
    times S = -1 -> 2.75 (raw [2.75, -2] -> [+1, -1]); the unanimous steps still give no sample."""
    group = signals.Group("A", 3, TASK, opened_at=0.0)
    group.rollouts = {j.trajectory.rollout_index: j for j in group_a()}
    policy, reward, _ = build_samples(group.request_id, group.ordered(), SignalsConfig())
    assert {s.sample_key: (s.reward, round(s.advantage, 6)) for s in policy.samples} == {
        "A/0/0": (2.0, 0.852483),  # 1.278724 * 2/3
        "A/1/0": (0.0, -0.116248),
        "A/2/0": (-1.5, -2.324953),  # -1.1624764 * 2
        "A/0/1": (1.0, 0.666667),
        "A/1/1": (-2.0, -1.0),
    }
    assert {s.sample_key: (s.reward, round(s.advantage, 6)) for s in reward.samples} == A_REWARD | {
        "A/2/0/0": (2.75, 1.0)
    }


def test_default_filter_trains_no_policy_step_on_an_all_success_group() -> None:
    group = group_b()
    policy, reward, signals_ = build_samples("B", group, UNWEIGHTED)
    assert policy.samples == [] and reward.samples == [] and signals_.policy_dropped_group == 2
    opened, _, _ = build_samples("B", group, OPEN)
    assert {s.sample_key: (s.reward, round(s.advantage, 6)) for s in opened.samples} == B_POLICY


def test_code_domain_scores_replace_consistency_rewards() -> None:
    """Judgement.score (CURE score of a judge-written unit test) is the raw reward, z-scored over m."""
    group = signals.Group("A", 3, TASK, opened_at=0.0)
    rollouts = []
    for j in group_a():
        steps = [
            msgspec.structs.replace(
                s,
                judgements=[
                    msgspec.structs.replace(x, score=float(3 * i)) for i, x in enumerate(s.judgements)
                ],
            )
            for s in j.steps
        ]
        rollouts.append(msgspec.structs.replace(j, steps=steps))
    group.rollouts = {j.trajectory.rollout_index: j for j in rollouts}
    _, reward, _ = build_samples(group.request_id, group.ordered(), UNWEIGHTED)
    # every step: scores [0, 3] -> mean 1.5, std 1.5 -> advantages [-1, +1], whatever R and the verdicts
    assert len(reward.samples) == 2 * 6
    assert {(s.sample_key[-1], s.reward, s.advantage) for s in reward.samples} == {
        ("0", 0.0, -1.0),
        ("1", 3.0, 1.0),
    }


def _record(value: JudgedTrajectory, offset: int, partition: int = 0) -> Record[JudgedTrajectory]:
    return Record(topics.JUDGED, partition, offset, value.trajectory.request_id, value, 0)


def test_watermark_waits_for_every_open_group_and_timeouts_flush() -> None:
    gatherer = signals.Gatherer(SignalsConfig(group_timeout_s=10.0, max_open_groups=10), dedup_window=100)
    a, b = group_a(), group_b()
    gatherer.add(_record(a[0], 0), now=0.0)
    gatherer.add(_record(b[0], 1), now=0.0)
    gatherer.add(_record(b[1], 2), now=0.0)
    gatherer.add(_record(b[1], 3), now=0.0)  # duplicate delivery
    assert [(g.request_id, action) for g, action in gatherer.decide(now=1.0)] == [("B", "train")]
    assert gatherer.watermark() == {(topics.JUDGED, 0): 0}  # A's first record still needed
    gatherer.add(_record(b[0], 4), now=1.0)  # late copy of a finished group
    assert gatherer.duplicates == 2 and "B" not in gatherer.groups
    gatherer.add(_record(a[1], 5), now=1.0)
    assert gatherer.decide(now=5.0) == []
    [(group, action)] = gatherer.decide(now=10.0)  # A times out with 2 of 3 rollouts
    assert (group.request_id, action) == ("A", "partial")
    assert gatherer.watermark() == {(topics.JUDGED, 0): 6}
    assert gatherer.forget_partitions(set()) == 0 and gatherer.watermark() == {}


def test_pending_variant_decisions() -> None:
    statuses = signals.TaskStatuses()
    variant = TaskSpec(
        task_id="v", domain="arith", difficulty=1, params={}, seed=1, status="pending", parent_id="p"
    )
    assert statuses.decision(variant) == "hold"
    statuses.update(variant)
    assert statuses.decision(variant) == "hold"
    statuses.update(TaskSpec(**{**_fields(variant), "status": "active", "version": 1}))
    statuses.update(TaskSpec(**{**_fields(variant), "status": "retired", "version": 2}))
    assert statuses.decision(variant) == "train"  # accepted once, later replaced: its rollouts still train
    statuses.update(TaskSpec(**{**_fields(variant), "task_id": "w", "status": "retired", "version": 1}))
    assert statuses.decision(TaskSpec(**{**_fields(variant), "task_id": "w"})) == "drop"


def _fields(spec: TaskSpec) -> dict[str, Any]:
    return {f: getattr(spec, f) for f in spec.__struct_fields__}


def partition_of(key: str, partitions: int) -> int:
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def same_partition_key(prefix: str, like: str, partitions: int) -> str:
    target = partition_of(like, partitions)
    return next(f"{prefix}{i}" for i in range(10_000) if partition_of(f"{prefix}{i}", partitions) == target)


def keyed(batches: list[Any]) -> dict[str, tuple[float, float]]:
    return {s.sample_key: (s.reward, round(s.advantage, 6)) for b in batches for s in b.samples}


@pytest.mark.timeout(90)
async def test_signals_role_end_to_end(kafka_config: Any) -> None:
    # every group trains here (group B succeeds twice): the role's plumbing, not the group filter
    config = RunConfig(kafka=kafka_config, signals=OPEN)
    shutdown = anyio.Event()
    n_parts = topics.TOPICS[topics.JUDGED].partitions
    variant = TaskSpec(
        task_id="v", domain="arith", difficulty=1, params={}, seed=2, status="pending", parent_id="t-base"
    )
    rejected = TaskSpec(
        task_id="w", domain="arith", difficulty=1, params={}, seed=3, status="pending", parent_id="t-base"
    )
    held_id = "C"
    probe_id = same_partition_key("probe", held_id, n_parts)  # read after C on the same partition
    async with Bus(kafka_config, role="test") as bus, anyio.create_task_group() as tg:
        tg.start_soon(lambda: signals.run(config, shutdown=shutdown))
        await bus.send(topics.TASKS, variant, key="v")
        await bus.send(topics.TASKS, rejected, key="w")
        a = group_a()
        for value in [
            a[0],
            a[1],
            a[1],
            *group_b(),
            a[2],
            a[0],
            *group_b("C", variant),
            *group_b("D", rejected),
        ]:
            await bus.send(topics.JUDGED, value, key=value.trajectory.request_id)
        for value in group_b(probe_id):
            await bus.send(topics.JUDGED, value, key=probe_id)

        # --- A and B exactly once; the held pending group C not yet ---
        policy = await wait_records(
            bus, topics.SAMPLES_POLICY, lambda v: {b.request_id for b in v} >= {"A", "B", probe_id}
        )
        assert sorted(b.request_id for b in policy) == sorted(["A", "B", probe_id])
        assert keyed([b for b in policy if b.request_id in "AB"]) == A_POLICY | B_POLICY
        reward = await wait_records(bus, topics.SAMPLES_REWARD, lambda v: len(v) >= 1)
        assert [b.request_id for b in reward] == ["A"] and keyed(reward) == A_REWARD

        # --- forge accepts v (active, version bumped) and rejects w (retired) ---
        await bus.send(
            topics.TASKS, TaskSpec(**{**_fields(variant), "status": "active", "version": 1}), key="v"
        )
        await bus.send(
            topics.TASKS, TaskSpec(**{**_fields(rejected), "status": "retired", "version": 1}), key="w"
        )
        policy = await wait_records(bus, topics.SAMPLES_POLICY, lambda v: "C" in {b.request_id for b in v})
        assert keyed([b for b in policy if b.request_id == "C"]) == {
            "C/0/0": (2.0, 1.0),
            "C/1/0": (1.0, -1.0),
        }

        def dropped(values: list[Metric]) -> bool:
            return any(
                m.name == "signals/groups_dropped" and m.labels == {"reason": "rejected"} for m in values
            )

        await wait_records(bus, topics.METRICS, dropped)
        policy = [r.value for r in await bus.read_topic(topics.SAMPLES_POLICY)]
        assert "D" not in {b.request_id for b in policy}

        # --- every group that left is settled once, with what became of it (the scheduler's count) ---
        settled = await wait_records(bus, topics.GROUPS, lambda v: len(v) >= 5)
        by_request = {
            g.request_id: (g.action, g.rollouts, g.policy_samples, g.reward_samples) for g in settled
        }
        sizes = {b.request_id: len(b.samples) for b in policy}
        assert by_request == {
            "A": ("train", 3, sizes["A"], len(reward[0].samples)),
            "B": ("train", 2, sizes["B"], 0),
            probe_id: ("train", 2, sizes[probe_id], 0),
            "C": ("train", 2, 2, 0),
            "D": ("rejected", 2, 0, 0),
        }
        assert len(settled) == 5
        shutdown.set()


# --- archive sink (consumers/archive.py): judged trajectories -> JSONL in the workdir ---
@pytest.mark.timeout(60)
async def test_archive_writes_each_judged_trajectory_once(kafka_config: Any, tmp_path: Any) -> None:
    config = RunConfig(kafka=kafka_config, workdir=str(tmp_path))
    shutdown = anyio.Event()
    a = group_a()
    async with Bus(kafka_config, role="test") as bus, anyio.create_task_group() as tg:
        tg.start_soon(lambda: archive.run(config, shutdown=shutdown))
        for value in [*a, a[0]]:  # one redelivery
            await bus.send(topics.JUDGED, value, key=value.trajectory.request_id)
        await eventually(
            lambda: (
                sum(len(p.read_bytes().splitlines()) for p in (tmp_path / "archive").glob("*.jsonl")) >= 3
            ),
            30,
            "three archived trajectories",
        )
        shutdown.set()
    items = list(archive.read_archive(tmp_path / "archive"))
    assert sorted(i["trajectory"]["rollout_index"] for i in items) == [0, 1, 2]
    assert items[0]["steps"][0]["judgements"][0]["verdict"] in (1, -1, 0) and "_offset" in items[0]


@pytest.mark.timeout(90)
async def test_signals_restart_rebuilds_an_open_group_from_the_watermark(kafka_config: Any) -> None:
    # every group trains here (group B succeeds twice): the role's plumbing, not the group filter
    config = RunConfig(kafka=kafka_config, signals=OPEN)
    probe_id = same_partition_key("B", "A", topics.TOPICS[topics.JUDGED].partitions)
    a = group_a()
    async with Bus(kafka_config, role="test") as bus:
        shutdown = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: signals.run(config, shutdown=shutdown))
            for value in [a[0], a[1], *group_b(probe_id)]:  # A open, then a whole group behind it
                await bus.send(topics.JUDGED, value, key=value.trajectory.request_id)
            await wait_records(bus, topics.SAMPLES_POLICY, lambda v: probe_id in {b.request_id for b in v})
            shutdown.set()  # A's first offset is the committed watermark: its 2 rollouts are not lost

        shutdown = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: signals.run(config, shutdown=shutdown))
            await bus.send(topics.JUDGED, a[2], key="A")
            policy = await wait_records(
                bus, topics.SAMPLES_POLICY, lambda v: "A" in {b.request_id for b in v}
            )
            settled = await wait_records(bus, topics.GROUPS, lambda v: "A" in {g.request_id for g in v})
            shutdown.set()
    assert keyed([b for b in policy if b.request_id == "A"]) == A_POLICY
    # the whole group behind A was re-read from the watermark (before A's last rollout): not published again
    assert sorted(b.request_id for b in policy) == sorted(["A", probe_id])
    assert sorted(g.request_id for g in settled) == sorted(["A", probe_id])
