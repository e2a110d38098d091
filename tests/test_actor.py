"""Actor: offset bookkeeping, and run() against the real broker with the tiny policy."""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from envs import get_environment
from envs.base import boxed
from infra.bus import Bus, Record
from infra.models.types import Completion
from producers import actor
from producers.actor import LiveEpisode, OffsetTracker, RequestRun
from schemas import topics
from schemas.config import ActorConfig, ModelConfig, PolicyLearnerConfig, RunConfig, SchedulerConfig
from schemas.events import RolloutRequest, Trajectory
from tests.conftest import wait_records

POLICY = ModelConfig(bootstrap_sft_seconds=5, max_new_tokens=12)


def record(partition: int, offset: int) -> Record[Any]:
    return Record(
        topic="t", partition=partition, offset=offset, key=None, value=None, timestamp_ms=0, headers={}
    )


@pytest.fixture
def model_home(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tiny presets built once per test session (unless FORGESTREAM_HOME already points at a cache)."""
    if not os.environ.get("FORGESTREAM_HOME"):
        monkeypatch.setenv("FORGESTREAM_HOME", str(tmp_path_factory.getbasetemp() / "forgestream-home"))


# --- pure parts ----------------------------------------------------------------------------------
def test_offsets_commit_only_past_a_done_prefix_and_never_backwards() -> None:
    tracker = OffsetTracker()
    r5, r6, r7 = record(0, 5), record(0, 6), record(0, 7)
    for r in (r5, r6, r7):
        tracker.start(r)
    tracker.finish(r6)
    assert tracker.committable() == {}  # 5 is still running
    tracker.finish(r5)
    assert tracker.committable() == {("t", 0): 7}
    tracker.start(r5)  # redelivered after a rebalance, already done
    tracker.finish(r5)
    tracker.finish(r7)
    assert tracker.committable() == {("t", 0): 8}
    tracker.start(record(1, 0))
    tracker.forget(record(1, 0))  # partition lost: nothing to commit there
    assert tracker.committable() == {}


def answer(text: str, logprob: float) -> Completion:
    return Completion(text=text, token_ids=[5, 6], logprobs=[logprob, logprob], prompt_token_ids=[1],
                      finish_reason="stop", version=3)  # fmt: skip


def two_live_episodes() -> tuple[list[LiveEpisode], list[str], list[str]]:
    """Two rollouts of one level-2 household task at their first turn: episodes, prompts, listed actions
    (take candle 1 from sofa 1, take cup 1 from table 1, ...)."""
    env = get_environment("household")
    task = env.sample_task(2, random.Random(3))
    request = RolloutRequest(request_id="r", task=task, n=2)
    live = [
        LiveEpisode(RequestRun(record(0, 0), request, remaining=2), i, env.reset(task), 40) for i in (0, 1)
    ]
    return live, [ep.episode.prompt() for ep in live], live[0].episode.admissible()


def test_a_redrawn_turn_plays_the_first_listed_answer_with_its_own_logprobs() -> None:
    live, prompts, listed = two_live_episodes()
    groups = [
        [
            answer("\\boxed{ fly to mars}", -1.0),
            answer(boxed(listed[1]), -2.0),
            answer(boxed(listed[0]), -3.0),
        ],
        [answer("\\boxed{ fly}", -4.0), answer("no box", -5.0)],  # none listed: the first is played
    ]
    actor.play_turn(live, prompts, groups)
    first, second = live[0].steps[0], live[1].steps[0]
    assert first.response == boxed(listed[1]) and first.valid_action
    assert first.behaviour_logprobs == [-2.0, -2.0] and first.policy_version == 3
    assert second.response == "\\boxed{ fly}" and not second.valid_action
    assert second.behaviour_logprobs == [-4.0, -4.0]


def test_a_redrawn_turn_keeps_the_invalid_draws_it_passed_over(model_home: None, tmp_path: Path) -> None:
    """The draws before the played one are kept on the step as rejected answers, each with the tokens
    that still spelled a listed action; when none was valid, every draw but the played first one is;
    draws after the played valid one are not."""
    from infra.models import load_trainable

    _, tokenizer = load_trainable(POLICY, role="policy", workdir=tmp_path)
    live, prompts, listed = two_live_episodes()

    def draw(text: str) -> Completion:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return Completion(text=text, token_ids=ids, logprobs=[-1.0] * len(ids), prompt_token_ids=[1],
                          finish_reason="stop", version=3)  # fmt: skip

    lost = draw("\\boxed{ take cup 1 from sofa 2}")  # listed: take cup 1 from table 1
    groups = [
        [lost, draw("no box"), draw(boxed(listed[0])), draw(boxed(listed[1]))],
        [draw("\\boxed{ fly}"), draw("no box"), draw("\\boxed{ fly away}")],  # none listed
    ]
    actor.play_turn(live, prompts, groups, tokenizer)
    first, second = live[0].steps[0], live[1].steps[0]
    assert first.response == boxed(listed[0]) and first.valid_action
    assert [r.response_token_ids for r in first.rejected] == [g.token_ids for g in groups[0][:2]]
    spelled = tokenizer.decode(lost.token_ids[: first.rejected[0].listed_prefix_tokens])
    assert spelled.strip() == "\\boxed{ take cup 1 from" and boxed("take cup 1 from table 1").startswith(
        spelled
    )
    assert first.rejected[1].listed_prefix_tokens == 0 and first.rejected[0].behaviour_logprobs[0] == -1.0
    assert not second.valid_action and second.response == "\\boxed{ fly}"
    assert [r.response_token_ids for r in second.rejected] == [g.token_ids for g in groups[1][1:]]
    actor.play_turn(live, prompts, [[draw(boxed(listed[0]))]] * 2, tokenizer)  # one draw: nothing passed over
    assert live[0].steps[1].rejected == [] and live[1].steps[1].rejected == []
    # the first draw listed: the draws after it were not passed over, whatever they say
    now = live[0].episode.admissible()
    group = [draw(boxed(now[0])), draw("no box"), draw(boxed(now[1]))]
    actor.play_turn(live[:1], [live[0].episode.prompt()], [group], tokenizer)
    assert live[0].steps[2].rejected == [] and live[0].steps[2].response == boxed(now[0])


def test_a_turn_records_the_listed_answers_as_the_state_listed_them(model_home: None, tmp_path: Path) -> None:
    """With `listed_answers`, each step carries every action listed before it was played, as the
    answer `\\boxed{ action}` + eos in the policy's tokens; without it, none."""
    from infra.models import load_trainable

    _, tokenizer = load_trainable(POLICY, role="policy", workdir=tmp_path)
    live, prompts, listed = two_live_episodes()
    played = tokenizer(boxed(listed[0]), add_special_tokens=False)["input_ids"]
    move = Completion(text=boxed(listed[0]), token_ids=played, logprobs=[-1.0] * len(played),
                      prompt_token_ids=[1], finish_reason="stop", version=3)  # fmt: skip
    actor.play_turn(live, prompts, [[move], [move]], tokenizer, listed_answers=True)
    step = live[0].steps[0]
    assert len(step.listed_answers) == len(listed) >= 3
    for action, tokens in zip(listed, step.listed_answers, strict=True):
        assert tokens[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(tokens[:-1]) == boxed(action)
    assert step.listed_answers[0] == played + [tokenizer.eos_token_id]
    assert live[0].episode.admissible() != listed  # the list changed with the move; the step kept the old
    actor.play_turn(live, [ep.episode.prompt() for ep in live], [[move], [move]], tokenizer)
    assert live[0].steps[1].listed_answers == []


def test_redraw_and_the_listed_losses_need_a_domain_that_lists_its_actions() -> None:
    RunConfig(actor=ActorConfig(redraw=8))  # household lists them
    with pytest.raises(ValueError, match=r"actor.redraw \(8\).*scheduler.domain 'arith'"):
        RunConfig(actor=ActorConfig(redraw=8), scheduler=SchedulerConfig(domain="arith"))
    with pytest.raises(
        ValueError, match=r"policy_learner.listed_token_coef \(1.0\).*scheduler.domain 'arith'"
    ):
        RunConfig(
            policy_learner=PolicyLearnerConfig(listed_token_coef=1.0),
            scheduler=SchedulerConfig(domain="arith"),
        )
    RunConfig(actor=ActorConfig(redraw=8), policy_learner=PolicyLearnerConfig(listed_conditional=True))
    with pytest.raises(
        ValueError, match=r"policy_learner.listed_conditional needs actor.redraw > 1 \(it is 1\)"
    ):
        RunConfig(actor=ActorConfig(redraw=1), policy_learner=PolicyLearnerConfig(listed_conditional=True))


def test_redraw_and_the_conditional_term_default_by_domain() -> None:
    """Unset, the actor redraws (8 answers) where the domain lists its actions and plays every answer
    elsewhere; the listed-conditional term follows the redraw. Set values are kept as given."""
    household = RunConfig()
    assert (household.actor.redraw, household.policy_learner.listed_conditional) == (8, True)
    arith = RunConfig(scheduler=SchedulerConfig(domain="arith"))
    assert (arith.actor.redraw, arith.policy_learner.listed_conditional) == (1, False)
    paper = RunConfig(actor=ActorConfig(redraw=1))
    assert (paper.actor.redraw, paper.policy_learner.listed_conditional) == (1, False)
    kept = RunConfig(
        actor=ActorConfig(redraw=4), policy_learner=PolicyLearnerConfig(listed_conditional=False)
    )
    assert (kept.actor.redraw, kept.policy_learner.listed_conditional) == (4, False)
    # resolved values are plain: the config encodes and decodes to an equal one
    assert msgspec.convert(msgspec.to_builtins(household), RunConfig) == household


def test_the_listed_answers_follow_the_policy_learners_losses() -> None:
    """The actor records a step's listed answers, and signals carries them, exactly when one of the
    policy learner's listed losses is on; both read it from `RunConfig.listed_answers`."""
    household = RunConfig().listed_answers
    assert (household.token_loss, household.conditional, household.recorded) == (False, True, True)
    token = RunConfig(
        actor=ActorConfig(redraw=1), policy_learner=PolicyLearnerConfig(listed_token_coef=0.5)
    ).listed_answers
    assert (token.token_loss, token.conditional, token.recorded) == (True, False, True)
    paper = RunConfig(actor=ActorConfig(redraw=1)).listed_answers
    assert (paper.token_loss, paper.conditional, paper.recorded) == (False, False, False)


# --- run() against the broker --------------------------------------------------------------------


def check_trajectories(trajectories: list[Trajectory], n: int, version: int, max_steps: int) -> None:
    assert sorted(t.rollout_index for t in trajectories) == list(range(n))
    for t in trajectories:
        assert t.group_size == n and t.outcome in (1, -1) and t.actor_id
        assert 1 <= len(t.steps) <= max_steps
        for i, step in enumerate(t.steps):
            assert step.index == i and step.prompt and step.observation
            assert step.policy_version == version
            assert len(step.behaviour_logprobs) == len(step.response_token_ids) >= 1
            assert all(lp <= 0.0 for lp in step.behaviour_logprobs)
            assert step.prompt_token_ids


def publish_policy(workdir: Path, version: int) -> Any:
    from infra.models import load_trainable
    from infra.weights import WeightStore

    net, tokenizer = load_trainable(POLICY, role="policy", workdir=workdir)
    return WeightStore(str(workdir / "weights")).publish("policy", version, net, tokenizer, preset="tiny")


@pytest.mark.timeout(120)
async def test_actor_turns_requests_into_trajectories_and_picks_up_new_policy(
    kafka_config: Any, model_home: None, tmp_path: Path
) -> None:
    config = RunConfig(
        workdir=str(tmp_path),
        kafka=kafka_config,
        policy_model=POLICY,
        actor=ActorConfig(parallel_episodes=4, max_steps=3),
        scheduler=SchedulerConfig(rollouts_per_task=3),
    )
    task = get_environment("household").sample_task(0, random.Random(7))
    first = RolloutRequest(request_id="req-a", task=task, n=3)
    shutdown = anyio.Event()
    async with Bus(kafka_config, role="test") as bus, anyio.create_task_group() as tg:
        await bus.send(topics.ROLLOUT_REQUESTS, first, key=task.task_id)
        await bus.send(topics.ROLLOUT_REQUESTS, first, key=task.task_id)  # redelivered: deduplicated
        tg.start_soon(functools.partial(actor.run, config, shutdown=shutdown))

        def of(request_id: str) -> Callable[[list[Trajectory]], list[Trajectory]]:
            return lambda values: [t for t in values if t.request_id == request_id]

        got = await wait_records(bus, topics.TRAJECTORIES, lambda v: len(of("req-a")(v)) >= 3)
        check_trajectories(of("req-a")(got), n=3, version=0, max_steps=3)

        # a new policy version is published: the next request's steps carry it
        published = await anyio.to_thread.run_sync(publish_policy, tmp_path, 1)
        await bus.send(topics.WEIGHTS, published, key="policy")
        second = RolloutRequest(request_id="req-b", task=task, n=2, min_policy_version=1)
        await bus.send(topics.ROLLOUT_REQUESTS, second, key=task.task_id)
        got = await wait_records(bus, topics.TRAJECTORIES, lambda v: len(of("req-b")(v)) >= 2)
        check_trajectories(of("req-b")(got), n=2, version=1, max_steps=3)
        # req-b came after the redelivered req-a on the same key (partition): it is the marker that the
        # redelivery was handled, and the episodes counter says how many rollouts were played
        metrics = await wait_records(
            bus, topics.METRICS, lambda v: sum(m.value for m in v if m.name == "actor/trajectories") >= 5
        )
        assert len(of("req-a")(await wait_records(bus, topics.TRAJECTORIES, lambda v: True))) == 3
        metrics = await wait_records(
            bus, topics.METRICS, lambda v: any(m.name == "actor/episodes_per_s" for m in v)
        )
        assert sum(m.value for m in metrics if m.name == "actor/trajectories") == 5
        # each trajectory under its own key, so a group's rollouts spread over the judges' partitions
        records = await bus.read_topic(topics.TRAJECTORIES)
        assert sorted(r.key for r in records) == ["req-a/0", "req-a/1", "req-a/2", "req-b/0", "req-b/1"]
        assert all(r.key == r.value.key for r in records)
        shutdown.set()
