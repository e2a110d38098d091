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
from schemas.config import OffPolicyConfig, PolicyLearnerConfig, RunConfig, SchedulerConfig
from schemas.events import GroupSettled, RolloutRequest, TaskSpec, WeightsPublished
from tests.conftest import eventually, wait_records


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


@pytest.mark.timeout(60)
async def test_a_task_view_is_restored_then_followed_and_told_of_changes_only(kafka_config: Any) -> None:
    from pipeline.taskpool import follow_tasks, restore_tasks

    pool, changes = TaskPool(), []
    async with Bus(kafka_config, role="test") as bus:
        await bus.send(topics.TASKS, task("a", "pending"), key="a")
        await restore_tasks(bus, pool)
        assert list(pool.tasks) == ["a"]
        shutdown = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow_tasks, bus, pool, shutdown, lambda: changes.append(len(pool)))
            for spec in (task("a", "active", version=1), task("a", "pending"), task("b")):  # one stale
                await bus.send(topics.TASKS, spec, key=spec.task_id)
            await eventually(lambda: "b" in pool.tasks, 30, "task b followed")
            shutdown.set()
    assert pool.tasks["a"].status == "active" and changes == [1, 2]  # "a" seen again at restore: no call


def test_flight_runs_until_settled_and_accepts_groups_that_train() -> None:
    flight = Flight(request_timeout_s=10.0)
    for request_id in ("r1", "r2", "r3"):
        flight.sent(request_id, at=0.0)
    assert (flight.running, flight.accepted) == (3, 0)
    flight.settled("r1", trains=True)
    assert (flight.running, flight.accepted) == (2, 1)  # policy samples: trained on
    flight.settled("r2", trains=False)
    assert (flight.running, flight.accepted) == (1, 1)  # no signal, or dropped: frees its slot only
    flight.settled("r1", trains=True)  # a copy after a signals restart: counted once
    assert flight.expire(now=11.0) == 1  # r3 never settled
    assert (flight.running, flight.accepted, flight.expired) == (0, 1, 1)
    flight.sent("r3", at=12.0)  # an earlier request re-read at a restart: done, not running again
    assert flight.running == 0


def test_flight_memory_stays_flat_over_ten_times_its_window() -> None:
    """1,000 requests through a window of 100: half settle, half are never settled and expire."""
    flight = Flight(request_timeout_s=10.0, finished_window=100)
    for i in range(1000):
        at = float(i)
        flight.sent(f"r{i}", at=at)
        if i % 2:
            flight.settled(f"r{i}", trains=True)
        flight.expire(now=at)
        assert len(flight.sent_at) <= 11 and len(flight.done) <= 100
    assert flight.accepted == 500 and flight.expired == 500 - 5  # the last 5 even requests still run
    flight.settled("r999", trains=True)  # a copy of a settled group: still ignored
    assert flight.accepted == 500


def test_pick_tasks_puts_unscheduled_pending_first_then_spreads() -> None:
    pool = [task("a"), task("b"), task("c", "pending")]
    scheduled: dict[str, int] = {"a": 3}
    picked = [t.task_id for t in pick_tasks(pool, 4, scheduled, random.Random(0))]
    assert picked[:2] == ["c", "b"]  # the fresh pending variant, then the never-scheduled task
    assert sorted(picked[2:]) == ["b", "c"]  # then b and c (1 each) before a (3)
    assert scheduled == {"a": 3, "b": 2, "c": 2}


# --- run() against the broker --------------------------------------------------------------------


def settled(request: RolloutRequest, policy_samples: int) -> GroupSettled:
    return GroupSettled(request_id=request.request_id, task_id=request.task.task_id,
                        action="train", rollouts=request.n, policy_samples=policy_samples)  # fmt: skip


async def gate(bus: Bus, room: int, running: int, accepted: int, consumed: int | None, version: int,
               times: int = 1) -> None:  # fmt: skip
    """Wait until the scheduler has decided this capacity (a positive marker: it saw the events)."""
    labels = {"running": str(running), "accepted": str(accepted), "consumed": str(consumed)}

    def seen(values: list) -> bool:
        hits = [m for m in values if m.name == "scheduler/gate" and m.value == room and m.step == version
                and m.labels == labels]  # fmt: skip
        return len(hits) >= times

    await wait_records(bus, topics.METRICS, seen)


@pytest.mark.timeout(90)
async def test_scheduler_seeds_pool_and_gates_requests_by_capacity(kafka_config: Any, tmp_path: Any) -> None:
    # eta=0: capacity = min(4 - running, floor(1 * per_version) - (accepted - consumed + running)),
    # running = requests not settled by signals yet, accepted = settled groups with policy samples,
    # consumed = groups the learner had consumed at its latest version, per_version = consumed / version
    # (1 before the first version).
    cfg = SchedulerConfig(
        domain="household",
        seed_tasks=3,
        seed_difficulty=0,
        rollouts_per_task=2,
        max_concurrent_requests=4,
        poll_s=0.1,
    )
    config = RunConfig(
        workdir=str(tmp_path), kafka=kafka_config, scheduler=cfg, off_policy=OffPolicyConfig(eta=0)
    )
    shutdown = anyio.Event()
    async with Bus(kafka_config, role="test") as bus, anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(scheduler.run, config, shutdown=shutdown))
        seeded = await wait_records(bus, topics.TASKS, lambda v: len(v) >= 3)
        assert len(seeded) == 3 and len({t.signature for t in seeded}) == 3
        assert all(t.status == "active" and t.difficulty == 0 for t in seeded)

        async def publish(version: int, consumed: int | None) -> None:
            await bus.send(topics.WEIGHTS, WeightsPublished(model="policy", version=version, uri=f"mem://v{version}",
                           sha256="0" * 64, bytes=1, groups_consumed=consumed), key="policy")  # fmt: skip

        async def requests(count: int) -> list[RolloutRequest]:
            return await wait_records(bus, topics.ROLLOUT_REQUESTS, lambda v: len(v) >= count)

        # version 0, nothing judged: capacity 1 -> exactly one request, then the gate closes.
        first = await requests(1)
        await gate(bus, 0, running=1, accepted=0, consumed=0, version=0)
        assert len(await bus.read_topic(topics.ROLLOUT_REQUESTS)) == 1
        request = first[0]
        assert request.n == 2 and request.task.task_id in {t.task_id for t in seeded}

        # settled with policy samples: running 0, accepted 1 -> capacity 1 - (1 - 0) = 0, still one
        # request; a copy (signals restarted) changes nothing.
        for _ in range(2):
            await bus.send(topics.GROUPS, settled(request, policy_samples=4), key=request.request_id)
        await gate(bus, 0, running=0, accepted=1, consumed=0, version=0)
        assert len(await bus.read_topic(topics.ROLLOUT_REQUESTS)) == 1

        # policy v1, its learner having consumed that group: capacity 1 - (1 - 1) = 1 -> exactly one
        # more request, for another task.
        await publish(1, consumed=1)
        both = await requests(2)
        await gate(bus, 0, running=1, accepted=1, consumed=1, version=1)
        assert len(await bus.read_topic(topics.ROLLOUT_REQUESTS)) == 2
        (second,) = [r for r in both if r.request_id != request.request_id]  # records come per partition
        assert second.task.task_id != request.task.task_id  # least-scheduled task first

        # its group settles without policy samples (no signal): it frees its slot, accepted stays 1
        # -> capacity 1 - (0 + 0) = 1 -> a third request.
        await bus.send(topics.GROUPS, settled(second, policy_samples=0), key=second.request_id)
        await requests(3)
        await gate(bus, 0, running=1, accepted=1, consumed=1, version=1, times=2)

        # policy v2 after 4 groups consumed in all: 2 per version -> capacity floor(1 * 2) - (0 + 1) = 1,
        # a fourth request (the learner counted groups this scheduler never saw settle: nothing is ahead)
        await publish(2, consumed=4)
        await requests(4)
        await gate(bus, 0, running=2, accepted=1, consumed=4, version=2)
        assert len(await bus.read_topic(topics.ROLLOUT_REQUESTS)) == 4

        # a learner that does not count (None): nothing counts as queued at it, one group per version
        # -> capacity 1 - running 2 < 0 -> 0, and no fifth request
        await publish(3, consumed=None)
        await gate(bus, 0, running=2, accepted=0, consumed=None, version=3)
        assert len(await bus.read_topic(topics.ROLLOUT_REQUESTS)) == 4
        shutdown.set()


@pytest.mark.timeout(90)
async def test_requests_of_one_task_spread_over_partitions(kafka_config: Any, tmp_path: Any) -> None:
    """Requests are keyed by request id: with a single task they still reach several partitions, so
    several actors share the work (a task key put them all on one partition, one actor)."""
    cfg = SchedulerConfig(domain="household", seed_tasks=1, seed_difficulty=0, rollouts_per_task=2,
                          max_concurrent_requests=8, poll_s=0.1)  # fmt: skip
    # eta 7: (7 + 1) groups before the first version, all 8 at once
    config = RunConfig(
        workdir=str(tmp_path), kafka=kafka_config, scheduler=cfg, off_policy=OffPolicyConfig(eta=7)
    )
    shutdown = anyio.Event()
    async with Bus(kafka_config, role="test") as bus, anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(scheduler.run, config, shutdown=shutdown))
        await wait_records(bus, topics.ROLLOUT_REQUESTS, lambda v: len(v) >= 8)
        records = await bus.read_topic(topics.ROLLOUT_REQUESTS)
        assert len({r.value.task.task_id for r in records}) == 1
        assert all(r.key == r.value.request_id for r in records)
        assert len({r.partition for r in records}) >= 3  # 8 hashed keys on 8 partitions
        shutdown.set()


@pytest.mark.timeout(90)
async def test_first_version_admits_the_groups_publish_every_needs(kafka_config: Any, tmp_path: Any) -> None:
    """A version of `publish_every` 3 batches takes at least 3 groups: before it exists the lockstep gate
    (eta 0) admits 3, not 1 (with 1 the learner would wait for groups the gate never admits)."""
    cfg = SchedulerConfig(domain="household", seed_tasks=4, seed_difficulty=0, rollouts_per_task=2,
                          max_concurrent_requests=4, poll_s=0.1)  # fmt: skip
    config = RunConfig(workdir=str(tmp_path), kafka=kafka_config, scheduler=cfg, off_policy=OffPolicyConfig(eta=0),
                       policy_learner=PolicyLearnerConfig(publish_every=3))  # fmt: skip
    shutdown = anyio.Event()
    async with Bus(kafka_config, role="test") as bus, anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(scheduler.run, config, shutdown=shutdown))
        await wait_records(bus, topics.ROLLOUT_REQUESTS, lambda v: len(v) >= 3)
        # the gate closed on them: capacity min(4 - 3, floor(1 * 3) - (0 + 3)) = 0
        await gate(bus, 0, running=3, accepted=0, consumed=0, version=0)
        assert len(await bus.read_topic(topics.ROLLOUT_REQUESTS)) == 3
        shutdown.set()
