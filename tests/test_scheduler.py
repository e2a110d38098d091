"""Scheduler: pool bookkeeping, task picking, and run() against the real broker (seeding, capacity)."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from infra.bus import Bus
from producers import scheduler
from producers.scheduler import Flight, TaskPool, pick_tasks
from schemas import topics
from schemas.config import RunConfig, SchedulerConfig
from schemas.events import JudgedTrajectory, RolloutRequest, TaskSpec, Trajectory, WeightsPublished


def task(task_id: str, status: str = "active", version: int = 0) -> TaskSpec:
    return TaskSpec(
        task_id=task_id, domain="household", difficulty=0, params={}, seed=0, status=status, version=version
    )  # type: ignore[arg-type]


# --- pure parts ----------------------------------------------------------------------------------
def test_pool_keeps_newest_version_and_drops_retired() -> None:
    pool = TaskPool()
    pool.update(task("a", "pending", version=0))
    pool.update(task("a", "active", version=1))
    pool.update(task("a", "pending", version=0))  # a late, older record never wins
    pool.update(task("b", "retired", version=2))
    assert pool.tasks["a"].status == "active"
    assert [t.task_id for t in pool.schedulable()] == ["a"]


def test_flight_counts_a_group_once_when_all_rollouts_are_judged() -> None:
    flight = Flight(request_timeout_s=10.0)
    flight.sent("r1", 2, at=0.0)
    flight.sent("r2", 2, at=0.0)
    flight.judged_one("r1", 0, 2)
    flight.judged_one("r1", 0, 2)  # redelivered judgement
    assert (flight.running, flight.accepted) == (2, 0)
    flight.judged_one("r1", 1, 2)
    assert (flight.running, flight.accepted) == (1, 1)
    flight.judged_one("r1", 1, 2)  # after the group is done: ignored
    assert flight.accepted == 1
    assert flight.expire(now=11.0) == 1  # r2 never judged
    assert (flight.running, flight.accepted, flight.expired) == (0, 1, 1)


def test_pick_tasks_puts_unscheduled_pending_first_then_spreads() -> None:
    pool = [task("a"), task("b"), task("c", "pending")]
    scheduled: dict[str, int] = {"a": 3}
    picked = [t.task_id for t in pick_tasks(pool, 4, scheduled, random.Random(0))]
    assert picked[:2] == ["c", "b"]  # the fresh pending variant, then the never-scheduled task
    assert sorted(picked[2:]) == ["b", "c"]  # then b and c (1 each) before a (3)
    assert scheduled == {"a": 3, "b": 2, "c": 2}


# --- run() against the broker --------------------------------------------------------------------
async def wait_records(
    bus: Bus, topic: str, ok: Callable[[list[Any]], bool], *, timeout: float = 30.0
) -> list[Any]:
    """Values on `topic` once `ok(values)` holds (re-read from the start until then)."""
    with anyio.fail_after(timeout):
        while True:
            values = [r.value for r in await bus.read_topic(topic)]
            if ok(values):
                return values
            await anyio.sleep(0.2)


def judged(request: RolloutRequest, index: int) -> JudgedTrajectory:
    trajectory = Trajectory(
        request_id=request.request_id,
        rollout_index=index,
        group_size=request.n,
        task=request.task,
        steps=[],
        outcome=1,
    )
    return JudgedTrajectory(trajectory=trajectory, steps=[], reward_version=0)


@pytest.mark.timeout(90)
async def test_scheduler_seeds_pool_and_gates_requests_by_capacity(kafka_config: Any, tmp_path: Any) -> None:
    # eta=0, batch_size=1: capacity = min(4 - running, (version + 1) * 1 - (accepted + running)).
    cfg = SchedulerConfig(
        domain="household",
        seed_tasks=3,
        rollouts_per_task=2,
        max_concurrent_requests=4,
        batch_size=1,
        eta=0,
        poll_s=0.1,
    )
    config = RunConfig(workdir=str(tmp_path), kafka=kafka_config, scheduler=cfg)
    shutdown = anyio.Event()
    async with Bus(kafka_config, role="test") as bus, anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(scheduler.run, config, shutdown=shutdown))
        seeded = await wait_records(bus, topics.TASKS, lambda v: len(v) >= 3)
        assert len(seeded) == 3 and len({t.signature for t in seeded}) == 3
        assert all(t.status == "active" and t.difficulty == 0 for t in seeded)

        # version 0, nothing judged: capacity 1 -> exactly one request, and it stays one.
        first = await wait_records(bus, topics.ROLLOUT_REQUESTS, lambda v: len(v) >= 1)
        await anyio.sleep(1.0)  # ten scheduler polls
        assert len(await bus.read_topic(topics.ROLLOUT_REQUESTS)) == 1
        request = first[0]
        assert request.n == 2 and request.task.task_id in {t.task_id for t in seeded}

        # the group is judged: running 0, accepted 1 -> capacity (0 + 1) - 1 = 0, still one request.
        for index in range(2):
            await bus.send(topics.JUDGED, judged(request, index), key=request.request_id)
        await anyio.sleep(1.0)
        assert len(await bus.read_topic(topics.ROLLOUT_REQUESTS)) == 1

        # policy v1: capacity (1 + 1) - 1 = 1 -> exactly one more request, for another task.
        weights = WeightsPublished(model="policy", version=1, uri="mem://v1", sha256="0" * 64, bytes=1)
        await bus.send(topics.WEIGHTS, weights, key="policy")
        both = await wait_records(bus, topics.ROLLOUT_REQUESTS, lambda v: len(v) >= 2)
        await anyio.sleep(1.0)
        assert len(await bus.read_topic(topics.ROLLOUT_REQUESTS)) == 2
        assert both[1].request_id != both[0].request_id
        assert both[1].task.task_id != both[0].task.task_id  # least-scheduled task first
        shutdown.set()
