"""Actor: offset bookkeeping, and run() against the real broker with the tiny policy."""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from envs import get_environment
from infra.bus import Bus, Record
from producers import actor
from producers.actor import OffsetTracker
from schemas import topics
from schemas.config import ActorConfig, ModelConfig, RunConfig, SchedulerConfig
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
        shutdown.set()
