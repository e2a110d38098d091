"""Scheduler: pool bookkeeping, task picking, and run() against the real broker (seeding, capacity)."""

from __future__ import annotations

import functools
import random
from typing import Any

import anyio
import pytest

from infra.bus import Bus
from pipeline.taskpool import TaskPool
from producers import scheduler
from producers.scheduler import Flight, pick_tasks
from schemas import topics
from schemas.config import RunConfig, SchedulerConfig
from schemas.events import (
    JudgedTrajectory,
    Judgement,
    RolloutRequest,
    Step,
    StepJudgement,
    TaskSpec,
    Trajectory,
    WeightsPublished,
)
from tests.conftest import wait_records


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


def signal(outcomes: list[int], verdicts: list[list[list[int]]]) -> bool:
    """A stand-in rule for the unit test: mixed outcomes carry a signal."""
    return len(set(outcomes)) > 1


def test_flight_runs_until_judged_and_accepts_groups_with_a_signal() -> None:
    flight = Flight(request_timeout_s=10.0, has_signal=signal)
    for request_id in ("r1", "r2", "r3"):
        flight.sent(request_id, 2, at=0.0)
    flight.judged_one("r1", 0, 2, 1, [[1]])
    flight.judged_one("r1", 0, 2, 1, [[1]])  # redelivered judgement
    assert (flight.running, flight.accepted) == (3, 0)
    flight.judged_one("r1", 1, 2, -1, [[-1]])
    assert (flight.running, flight.accepted) == (2, 1)  # judged, mixed outcomes: trained on
    flight.judged_one("r2", 0, 2, -1, [[0]])
    flight.judged_one("r2", 1, 2, -1, [[0]])
    assert (flight.running, flight.accepted) == (1, 1)  # no signal: frees its slot, not accepted
    flight.judged_one("r1", 1, 2, -1, [[-1]])  # after the group is done: ignored
    assert flight.expire(now=11.0) == 1  # r3 never judged
    assert (flight.running, flight.accepted, flight.expired) == (0, 1, 1)


def test_flight_memory_stays_flat_over_ten_times_its_window() -> None:
    """A run of days: finished ids live in an LRU window, and a group that never completes (sent, or
    only partly judged after a restart) is forgotten after the timeout."""
    flight = Flight(request_timeout_s=10.0, has_signal=signal, finished_window=100)
    for i in range(1000):
        at = float(i)
        flight.sent(f"r{i}", 2, at=at)
        flight.judged_one(f"r{i}", 0, 2, 1, [[1]], at=at)
        if i % 2:
            flight.judged_one(f"r{i}", 1, 2, -1, [[-1]], at=at)  # odd groups finish (with a signal)
        flight.judged_one(f"late{i}", 0, 2, 1, [[1]], at=at)  # judged only, never completed
        flight.expire(now=at)
        sizes = (len(flight.sent_at), len(flight.first_seen), len(flight.judged), len(flight.group_size))
        assert max(sizes) <= 2 * 11 and len(flight.done) <= 100
    assert flight.accepted == 500 and flight.expired == 500 - 5  # the last 5 even groups still run
    flight.judged_one("r999", 1, 2, -1, [[-1]])  # a redelivery of a finished group: still ignored
    assert flight.accepted == 500


def test_pick_tasks_puts_unscheduled_pending_first_then_spreads() -> None:
    pool = [task("a"), task("b"), task("c", "pending")]
    scheduled: dict[str, int] = {"a": 3}
    picked = [t.task_id for t in pick_tasks(pool, 4, scheduled, random.Random(0))]
    assert picked[:2] == ["c", "b"]  # the fresh pending variant, then the never-scheduled task
    assert sorted(picked[2:]) == ["b", "c"]  # then b and c (1 each) before a (3)
    assert scheduled == {"a": 3, "b": 2, "c": 2}


# --- run() against the broker --------------------------------------------------------------------


def judged(request: RolloutRequest, index: int, outcome: int, verdict: int) -> JudgedTrajectory:
    """A judged one-step rollout (token ids are placeholders: the scheduler reads outcome and verdicts)."""
    step = Step(
        index=0,
        prompt="p",
        response="r",
        prompt_token_ids=[1],
        response_token_ids=[2],
        behaviour_logprobs=[-0.5],
        policy_version=0,
    )
    trajectory = Trajectory(
        request_id=request.request_id,
        rollout_index=index,
        group_size=request.n,
        task=request.task,
        steps=[step],
        outcome=outcome,  # type: ignore[arg-type]
    )
    judgement = Judgement(
        verdict=verdict,  # type: ignore[arg-type]
        prompt_token_ids=[1],
        response_token_ids=[2],
        behaviour_logprobs=[-0.1],
    )
    return JudgedTrajectory(
        trajectory=trajectory, steps=[StepJudgement(step_index=0, judgements=[judgement])], reward_version=0
    )


@pytest.mark.timeout(90)
async def test_scheduler_seeds_pool_and_gates_requests_by_capacity(kafka_config: Any, tmp_path: Any) -> None:
    # eta=0, batch_size=1: capacity = min(4 - running, (version + 1) * 1 - (accepted + running)),
    # running = requests not fully judged, accepted = judged groups with a training signal.
    cfg = SchedulerConfig(
        domain="household",
        seed_tasks=3,
        seed_difficulty=0,
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

        async def gate(room: int, running: int, accepted: int, version: int, times: int = 1) -> None:
            """Wait until the scheduler has decided this capacity (a positive marker: it saw the events)."""

            def seen(values: list) -> bool:
                hits = [m for m in values if m.name == "scheduler/gate" and m.value == room and m.step == version
                        and m.labels == {"running": str(running), "accepted": str(accepted)}]  # fmt: skip
                return len(hits) >= times

            await wait_records(bus, topics.METRICS, seen)

        # version 0, nothing judged: capacity 1 -> exactly one request, then the gate closes.
        first = await wait_records(bus, topics.ROLLOUT_REQUESTS, lambda v: len(v) >= 1)
        await gate(0, running=1, accepted=0, version=0)
        assert len(await bus.read_topic(topics.ROLLOUT_REQUESTS)) == 1
        request = first[0]
        assert request.n == 2 and request.task.task_id in {t.task_id for t in seeded}

        # judged, one success and one failure (R = +2, -2: a signal): running 0, accepted 1
        # -> capacity (0 + 1) - 1 = 0, still one request.
        await bus.send(topics.JUDGED, judged(request, 0, 1, 1), key=request.request_id)
        await bus.send(topics.JUDGED, judged(request, 1, -1, -1), key=request.request_id)
        await gate(0, running=0, accepted=1, version=0)
        assert len(await bus.read_topic(topics.ROLLOUT_REQUESTS)) == 1

        # policy v1: capacity (1 + 1) - 1 = 1 -> exactly one more request, for another task.
        weights = WeightsPublished(model="policy", version=1, uri="mem://v1", sha256="0" * 64, bytes=1)
        await bus.send(topics.WEIGHTS, weights, key="policy")
        both = await wait_records(bus, topics.ROLLOUT_REQUESTS, lambda v: len(v) >= 2)
        await gate(0, running=1, accepted=1, version=1)
        assert len(await bus.read_topic(topics.ROLLOUT_REQUESTS)) == 2
        (second,) = [r for r in both if r.request_id != request.request_id]  # records come per partition
        assert second.task.task_id != request.task.task_id  # least-scheduled task first

        # its group is judged without a training signal (both failed, verdicts unparseable: R = -1, -1):
        # it frees its slot, accepted stays 1 -> capacity (1 + 1) - 1 = 1 -> a third request.
        for index in range(2):
            await bus.send(topics.JUDGED, judged(second, index, -1, 0), key=second.request_id)
        await wait_records(bus, topics.ROLLOUT_REQUESTS, lambda v: len(v) >= 3)
        await gate(0, running=1, accepted=1, version=1, times=2)
        assert len(await bus.read_topic(topics.ROLLOUT_REQUESTS)) == 3
        shutdown.set()


@pytest.mark.timeout(90)
async def test_requests_of_one_task_spread_over_partitions(kafka_config: Any, tmp_path: Any) -> None:
    """Requests are keyed by request id: with a single task they still reach several partitions, so
    several actors share the work (a task key put them all on one partition, one actor)."""
    cfg = SchedulerConfig(domain="household", seed_tasks=1, seed_difficulty=0, rollouts_per_task=2,
                          max_concurrent_requests=8, batch_size=8, eta=0, poll_s=0.1)  # fmt: skip
    config = RunConfig(workdir=str(tmp_path), kafka=kafka_config, scheduler=cfg)
    shutdown = anyio.Event()
    async with Bus(kafka_config, role="test") as bus, anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(scheduler.run, config, shutdown=shutdown))
        await wait_records(bus, topics.ROLLOUT_REQUESTS, lambda v: len(v) >= 8)
        records = await bus.read_topic(topics.ROLLOUT_REQUESTS)
        assert len({r.value.task.task_id for r in records}) == 1
        assert all(r.key == r.value.request_id for r in records)
        assert len({r.partition for r in records}) >= 3  # 8 hashed keys on 8 partitions
        shutdown.set()
