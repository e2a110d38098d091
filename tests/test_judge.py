"""Judge: context replay, and run() against the real broker with the tiny reward model."""

from __future__ import annotations

import functools
import os
import random
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from consumers import judge
from consumers.judge import judge_steps, step_contexts
from envs import get_environment
from infra.bus import Bus, FatalError
from infra.models.types import Completion
from schemas import topics
from schemas.config import JudgeConfig, ModelConfig, RunConfig
from schemas.events import JudgedTrajectory, Step, Trajectory
from tests.conftest import wait_records

REWARD = ModelConfig(bootstrap_sft_seconds=5, max_new_tokens=16)
ENV = get_environment("household")


@pytest.fixture
def model_home(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tiny presets built once per test session (unless FORGESTREAM_HOME already points at a cache)."""
    if not os.environ.get("FORGESTREAM_HOME"):
        monkeypatch.setenv("FORGESTREAM_HOME", str(tmp_path_factory.getbasetemp() / "forgestream-home"))


def oracle_trajectory(seed: int, request_id: str, index: int = 0, group_size: int = 2) -> Trajectory:
    """A trajectory that follows the oracle (token ids are placeholders: the judge does not read them)."""
    task = ENV.sample_task(0, random.Random(seed))
    episode = ENV.reset(task)
    steps = []
    for i, response in enumerate(ENV.oracle(task)):
        prompt = episode.prompt()
        result = episode.step(response)
        steps.append(
            Step(
                index=i,
                prompt=prompt,
                response=response,
                prompt_token_ids=[1, 2],
                response_token_ids=[3],
                behaviour_logprobs=[-0.5],
                policy_version=0,
                observation=result.observation,
            )
        )
    return Trajectory(
        request_id=request_id,
        rollout_index=index,
        group_size=group_size,
        task=task,
        steps=steps,
        outcome=episode.outcome,
    )


# --- pure parts ----------------------------------------------------------------------------------
def test_contexts_come_from_replaying_the_episode() -> None:
    trajectory = oracle_trajectory(3, "r")
    contexts = step_contexts(ENV, trajectory)
    assert len(contexts) == len(trajectory.steps) >= 1
    episode = ENV.reset(trajectory.task)
    for i, step in enumerate(trajectory.steps):
        assert contexts[i] == episode.judge_context(i)
        episode.step(step.response)
    assert "Previous actions: none" in contexts[0]


def test_oracle_verdicts_are_the_environments_step_labels() -> None:
    good = oracle_trajectory(5, "o")
    detour = Step(index=0, prompt="p", response="\\boxed{99}", prompt_token_ids=[1], response_token_ids=[2],
                  behaviour_logprobs=[-1.0], policy_version=0)  # fmt: skip
    steps = [detour] + [msgspec.structs.replace(s, index=s.index + 1) for s in good.steps]
    judged = judge.oracle_steps(ENV, msgspec.structs.replace(good, steps=steps), 3)
    assert [s.step_index for s in judged] == list(range(len(steps)))
    assert [s.verdicts for s in judged] == [[-1, -1, -1]] + [[1, 1, 1]] * len(good.steps)
    assert all(j.response_token_ids == [] and j.text == "oracle" for s in judged for j in s.judgements)
    # the format alone: only the invalid answer is bad; the plan alone: the invalid answer is neutral
    invalid_only = judge.oracle_steps(
        ENV, msgspec.structs.replace(good, steps=steps), 1, mode="oracle-invalid"
    )
    assert [s.verdicts for s in invalid_only] == [[-1]] + [[0]] * len(good.steps)
    valid_only = judge.oracle_steps(ENV, msgspec.structs.replace(good, steps=steps), 1, mode="oracle-valid")
    assert [s.verdicts for s in valid_only] == [[0]] + [[1]] * len(good.steps)


def test_oracle_explore_counts_a_search_step_as_progress() -> None:
    """Seed 1, level 4: the spoon is in closed dresser 1; opening cabinet 1 first searches."""
    task = ENV.sample_task(4, random.Random(1))
    search = Step(index=0, prompt="p", response="\\boxed{0}", prompt_token_ids=[1], response_token_ids=[2],
                  behaviour_logprobs=[-1.0], policy_version=0)  # fmt: skip
    trajectory = Trajectory(
        request_id="x", rollout_index=0, group_size=1, task=task, steps=[search], outcome=-1
    )
    assert judge.oracle_steps(ENV, trajectory, 1)[0].verdicts == [-1]
    assert judge.oracle_steps(ENV, trajectory, 1, mode="oracle-explore")[0].verdicts == [1]


def unit_tests(*tests: tuple[str, str]) -> Completion:
    text = "".join(f"**Test Input:**\n```\n{i}\n```\n**Test Output:**\n```\n{o}\n```\n" for i, o in tests)
    return Completion(
        text=text or "no tests here",
        token_ids=[5, 6],
        logprobs=[-0.1, -0.2],
        prompt_token_ids=[1],
        finish_reason="stop",
        version=0,
    )


def test_code_domain_scores_the_reward_models_unit_tests() -> None:
    env = get_environment("code")
    task = env.sample_task(0, random.Random(1))
    assert task.params["template"] == "count_vowels"  # reference: vowels in s.lower()
    wrong = "```python\ndef count_vowels(s):\n    return len([c for c in s if c != ' '])\n```"
    episode = env.reset(task)
    result = episode.step(wrong)
    assert episode.outcome == -1
    step = Step(
        index=0,
        prompt="p",
        response=wrong,
        prompt_token_ids=[1],
        response_token_ids=[2],
        behaviour_logprobs=[-1.0],
        policy_version=0,
        observation=result.observation,
    )
    trajectory = Trajectory(
        request_id="c", rollout_index=0, group_size=1, task=task, steps=[step], outcome=-1
    )
    samples = [
        # correct test the wrong program fails: verdict -1; CURE +1 (it catches the bug)
        unit_tests(("'xyz'", "0")),
        # correct test it passes (0) + incorrect test ('ab' has 1 vowel) it passes (-1): verdict +1, score -1
        unit_tests(("'AE'", "2"), ("'ab'", "2")),
        # no test: verdict 0, score 0
        unit_tests(),
    ]
    (judged,) = judge_steps(env, trajectory, [samples])
    assert judged.verdicts == [-1, 1, 0]
    assert [j.score for j in judged.judgements] == [1.0, -1.0, 0.0]
    assert judged.judgements[0].response_token_ids == [5, 6]


# --- run() against the broker --------------------------------------------------------------------


@pytest.mark.timeout(120)
async def test_judge_gives_m_verdicts_per_step(kafka_config: Any, model_home: None, tmp_path: Path) -> None:
    m = 3
    config = RunConfig(
        workdir=str(tmp_path),
        kafka=kafka_config,
        reward_model=REWARD,
        judge=JudgeConfig(m=m, max_new_tokens=16),
    )
    trajectories = [oracle_trajectory(11, "req-j", i, group_size=3) for i in range(2)]
    marker = oracle_trajectory(
        11, "req-j", 2, group_size=3
    )  # same key, so the same partition, after the redelivery
    shutdown = anyio.Event()
    async with Bus(kafka_config, role="test") as bus, anyio.create_task_group() as tg:
        for t in [*trajectories, trajectories[0], marker]:  # the third one is a redelivery: deduplicated
            await bus.send(topics.TRAJECTORIES, t, key=t.request_id)
        tg.start_soon(functools.partial(judge.run, config, shutdown=shutdown))
        await wait_records(bus, topics.JUDGED, lambda v: any(j.key == "req-j/2" for j in v))
        got: list[JudgedTrajectory] = [r.value for r in await bus.read_topic(topics.JUDGED)]
        assert sorted(j.key for j in got) == ["req-j/0", "req-j/1", "req-j/2"]
        for judged in got:
            assert judged.reward_version == 0 and judged.judge_id
            assert [s.step_index for s in judged.steps] == [s.index for s in judged.trajectory.steps]
            for step in judged.steps:
                assert len(step.judgements) == m
                for j in step.judgements:
                    assert j.verdict in (1, -1, 0)
                    assert len(j.behaviour_logprobs) == len(j.response_token_ids) >= 1
                    assert all(lp <= 0.0 for lp in j.behaviour_logprobs)
                    assert j.prompt_token_ids and isinstance(j.text, str)  # may be empty (eos first)
        shutdown.set()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("follow", [True, False])
async def test_judges_follow_or_stay_pinned_to_the_preset(
    kafka_config: Any, model_home: None, tmp_path: Path, follow: bool
) -> None:
    """Version 1 is published before the judge starts; three trajectories follow one by one. Both cases
    run the same sequence: the following judge (the positive control) serves v1 by the last one."""
    from infra.models import load_trainable
    from infra.weights import WeightStore

    config = RunConfig(
        workdir=str(tmp_path),
        kafka=kafka_config,
        reward_model=REWARD,
        judge=JudgeConfig(max_new_tokens=8, follow_weights=follow),
    )
    net, tokenizer = load_trainable(REWARD, role="reward", workdir=tmp_path)
    published = WeightStore.for_run(config).publish("reward", 1, net, tokenizer, preset="tiny")
    shutdown = anyio.Event()
    async with Bus(kafka_config, role="test") as bus, anyio.create_task_group() as tg:
        await bus.send(topics.WEIGHTS, published, key="reward")
        tg.start_soon(functools.partial(judge.run, config, shutdown=shutdown))
        for i in range(3):
            trajectory = oracle_trajectory(11, f"req-w{i}", 0, group_size=1)
            await bus.send(topics.TRAJECTORIES, trajectory, key=trajectory.request_id)
            await wait_records(bus, topics.JUDGED, lambda v, n=i + 1: len(v) >= n)
            await anyio.sleep(2)
        judged: list[JudgedTrajectory] = await wait_records(bus, topics.JUDGED, lambda v: len(v) == 3)
        shutdown.set()
    versions = [j.reward_version for j in sorted(judged, key=lambda j: j.key)]
    assert versions[-1] == 1 if follow else versions == [0, 0, 0], versions


@pytest.mark.timeout(60)
async def test_the_oracle_judge_loads_no_model_and_labels_every_step(
    kafka_config: Any, tmp_path: Path
) -> None:
    config = RunConfig(workdir=str(tmp_path), kafka=kafka_config, judge=JudgeConfig(verdicts="oracle"))
    trajectory = oracle_trajectory(13, "req-o")
    shutdown = anyio.Event()
    async with Bus(kafka_config, role="test") as bus, anyio.create_task_group() as tg:
        await bus.send(topics.TRAJECTORIES, trajectory, key=trajectory.request_id)
        tg.start_soon(functools.partial(judge.run, config, shutdown=shutdown))
        (judged,) = await wait_records(bus, topics.JUDGED, lambda v: len(v) == 1)
        shutdown.set()
    assert judged.reward_version == 0 and judged.judge_id.startswith("oracle-")
    assert [s.verdicts for s in judged.steps] == [[1, 1, 1]] * len(trajectory.steps)


@pytest.mark.timeout(60)
async def test_a_sandbox_that_cannot_start_stops_the_judge_and_dead_letters_nothing(
    kafka_config: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Judging a code step runs the policy's program; where the sandbox cannot start, that is the
    machine's fault, not the trajectory's: the judge stops (the role restarts, the record stays
    uncommitted) instead of dead-lettering every code trajectory."""
    code = get_environment("code")
    task = code.sample_task(0, random.Random(3))
    step = Step(index=0, prompt="p", response=code.oracle(task)[0], prompt_token_ids=[1], response_token_ids=[3],
                behaviour_logprobs=[-0.5], policy_version=0, observation="")  # fmt: skip
    trajectory = Trajectory(
        request_id="req-sbx", rollout_index=0, group_size=1, task=task, steps=[step], outcome=1
    )
    config = RunConfig(workdir=str(tmp_path), kafka=kafka_config, judge=JudgeConfig(verdicts="oracle"))
    monkeypatch.setenv("FORGESTREAM_SANDBOX", "off")  # not a mode: no sandbox can start
    async with Bus(kafka_config, role="test") as bus:
        await bus.send(topics.TRAJECTORIES, trajectory, key=trajectory.request_id)
        with (
            pytest.RaisesGroup(
                pytest.RaisesExc(FatalError, match="sandbox"), flatten_subgroups=True, allow_unwrapped=True
            ),
            anyio.fail_after(45),
        ):
            await judge.run(config)
        assert [r for r in await bus.read_topic(topics.DLQ)] == []
        monkeypatch.delenv("FORGESTREAM_SANDBOX")  # the machine fixed: the same record is judged
        shutdown = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(judge.run, config, shutdown=shutdown))
            (judged,) = await wait_records(bus, topics.JUDGED, lambda v: len(v) == 1)
            shutdown.set()
    assert judged.key == "req-sbx/0" and judged.steps[0].verdicts == [1, 1, 1]
