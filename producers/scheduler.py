"""Scheduler: samples tasks from the pool and asks the actors for rollout groups.

Consumes: `forge.tasks` (the task pool: last value per task_id, active + pending),
          `forge.groups` (GroupSettled: what the signals stage did with each group),
          `forge.weights` (latest policy version, and the groups its learner had consumed),
          `forge.rollout.requests` once at start (what an earlier incarnation already asked for).
Produces: `forge.rollout.requests` (RolloutRequest of n = rollouts_per_task, key request_id),
          `forge.tasks` (seed tasks, only when the pool is empty), metrics `scheduler/*`
          (`scheduler/gate`: the capacity whenever its inputs change, labelled running / accepted /
          consumed).
Invariant: requests in flight never exceed `algorithm.capacity` (AReaL's gate): running = requests
sent whose group the signals stage has not settled yet, accepted = settled groups that yielded policy
samples (what the learner trains on, as signals decided it: no second computation here), consumed =
the groups the policy learner had trained or dropped when it published its latest version (the
version's `groups_consumed`), and a version's share of groups is what the learner's versions have
consumed on average (`algorithm.groups_per_version`: a version is `policy_learner.publish_every`
batches, each whole groups until `policy_learner.batch_samples` samples, so no second setting here;
never fewer than `RunConfig.version_groups_at_least`, the share before the first version). So at most
eta + 1 versions' worth of groups run or wait at the learner, and no trained sample is more than `eta`
versions stale unless the learner falls behind its own batch size. A group with no signal (every
advantage 0: e.g. all rollouts failed and the verdicts tell no step apart), or one dropped (a rejected
variant), is never trained on, so it frees its slot without counting as accepted: otherwise a policy
that fails everything would stall the loop with the learner waiting for samples that never come. A
request never settled after `request_timeout_s` (lost to the DLQ, a retired task) stops counting as
running.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field

import anyio
import msgspec

from algorithm import capacity, groups_per_version
from envs import get_environment
from envs.base import Environment
from envs.seeds import training_rng
from infra.bus import Bus, RecentKeys
from pipeline.taskpool import TaskPool, follow_tasks, restore_tasks
from schemas import topics
from schemas.config import RunConfig
from schemas.events import RolloutRequest, TaskSpec, WeightsPublished

log = logging.getLogger("forgestream.scheduler")


# --- seeding and picking ------------------------------------------------------------------------
def seed_tasks(env: Environment, count: int, difficulty: int, rng: random.Random) -> list[TaskSpec]:
    """`count` distinct tasks (by signature) at `difficulty`; deterministic in rng."""
    tasks: list[TaskSpec] = []
    seen: set[str] = set()
    for _ in range(count * 20):
        if len(tasks) == count:
            break
        task = env.sample_task(difficulty, training_rng(rng))
        signature = task.signature or env.signature(task)
        if signature in seen:
            continue
        seen.add(signature)
        tasks.append(msgspec.structs.replace(task, signature=signature, status="active"))
    return tasks


# --- in-flight accounting ------------------------------------------------------------------------
@dataclass
class Flight:
    """Which requests are running (until the signals stage settles their group) and how many settled
    groups train the policy. Bounded on a long run: finished ids are remembered in an LRU window, and
    a request never settled is forgotten `request_timeout_s` after it was sent."""

    request_timeout_s: float
    finished_window: int = 100_000
    sent_at: dict[str, float] = field(default_factory=dict)  # running request_id -> monotonic send time
    accepted: int = 0  # settled groups with policy samples
    expired: int = 0

    def __post_init__(self) -> None:
        self.done = RecentKeys(self.finished_window)

    def sent(self, request_id: str, at: float) -> None:
        if request_id not in self.done:
            self.sent_at.setdefault(request_id, at)

    def settled(self, request_id: str, trains: bool) -> None:
        """Its group left the signals stage (a copy after a signals restart counts once)."""
        if request_id in self.done:
            return
        self.accepted += trains
        self._forget(request_id)

    def _forget(self, request_id: str) -> None:
        self.done.add(request_id)
        self.sent_at.pop(request_id, None)

    def expire(self, now: float) -> int:
        """Forget requests sent longer than the timeout ago and never settled; returns how many (they
        stop counting as running)."""
        old = [r for r, t in self.sent_at.items() if now - t > self.request_timeout_s]
        for request_id in old:
            self._forget(request_id)
        self.expired += len(old)
        return len(old)

    @property
    def running(self) -> int:
        return len(self.sent_at)


# --- task sampling -------------------------------------------------------------------------------
def pick_tasks(
    candidates: list[TaskSpec], count: int, scheduled: dict[str, int], rng: random.Random
) -> list[TaskSpec]:
    """Pending variants never rolled out first (the forge is waiting to judge them), then the
    least-scheduled tasks, ties broken by rng; mutates `scheduled`."""
    picked: list[TaskSpec] = []
    for _ in range(count):
        if not candidates:
            break
        fresh_pending = [t for t in candidates if t.status == "pending" and scheduled.get(t.task_id, 0) == 0]
        pool = fresh_pending or candidates
        least = min(scheduled.get(t.task_id, 0) for t in pool)
        ties = sorted((t for t in pool if scheduled.get(t.task_id, 0) == least), key=lambda t: t.task_id)
        task = rng.choice(ties)
        scheduled[task.task_id] = scheduled.get(task.task_id, 0) + 1
        picked.append(task)
    return picked


# --- the role ------------------------------------------------------------------------------------
async def run(config: RunConfig, *, shutdown: anyio.Event | None = None) -> None:
    shutdown = shutdown or anyio.Event()
    cfg, eta = config.scheduler, config.off_policy.eta
    env = get_environment(cfg.domain)
    rng = random.Random(config.seed)
    pool = TaskPool()
    flight = Flight(request_timeout_s=cfg.request_timeout_s)
    scheduled: dict[str, int] = {}
    version = 0
    consumed: int | None = 0  # groups the policy learner had trained or dropped at `version`
    wake = anyio.Event()

    def poke() -> None:
        nonlocal wake
        wake.set()
        wake = anyio.Event()

    async with Bus(config.kafka, role="scheduler") as bus:
        # --- restore: pool, earlier requests (keeps request ids unique across restarts) ---
        await restore_tasks(bus, pool)
        previous = await bus.read_topic(topics.ROLLOUT_REQUESTS)
        now = time.monotonic()
        for record in previous:
            request: RolloutRequest = record.value
            flight.sent(request.request_id, now)
            scheduled[request.task.task_id] = scheduled.get(request.task.task_id, 0) + 1
        sequence = len(previous)
        log.info("scheduler: %d tasks in pool, %d earlier requests", len(pool), sequence)

        # --- seed an empty pool ---
        if not pool.schedulable():
            for task in seed_tasks(env, cfg.seed_tasks, cfg.seed_difficulty, rng):
                await bus.send(topics.TASKS, task, key=task.task_id)
                pool.update(task)
            log.info("scheduler: seeded %d tasks at difficulty %d", len(pool), cfg.seed_difficulty)

        async def follow_groups() -> None:
            async for record in bus.follow_topic(topics.GROUPS, shutdown=shutdown):
                flight.settled(record.value.request_id, trains=record.value.policy_samples > 0)
                poke()

        async def follow_weights() -> None:
            nonlocal version, consumed
            async for record in bus.follow_topic(topics.WEIGHTS, shutdown=shutdown):
                published: WeightsPublished = record.value
                if published.model == "policy" and published.version > version:
                    version, consumed = published.version, published.groups_consumed
                    if consumed is None:
                        log.warning("scheduler: policy v%d does not say what its learner consumed: the "
                                    "gate counts running requests only", version)  # fmt: skip
                    poke()

        async def emit() -> None:
            nonlocal sequence
            last_gate: tuple[int, int, int, int | None, int] | None = None
            while not shutdown.is_set():
                flight.expire(time.monotonic())
                # a learner that does not count what it consumed: nothing counts as queued at it
                accepted = flight.accepted if consumed is not None else 0
                room = capacity(
                    cfg.max_concurrent_requests,
                    flight.running,
                    accepted,
                    consumed or 0,
                    groups_per_version(consumed or 0, version, config.version_groups_at_least),
                    eta,
                )
                gate = (room, flight.running, accepted, consumed, version)
                if gate != last_gate:  # every decision the gate changes, observable (and a test marker)
                    last_gate = gate
                    await bus.metric("scheduler/gate", float(room), step=version, running=str(flight.running),
                                     accepted=str(accepted), consumed=str(consumed))  # fmt: skip
                picked = pick_tasks(pool.schedulable(), room, scheduled, rng)
                for task in picked:
                    request = RolloutRequest(
                        request_id=f"req-{config.seed}-{sequence:07d}-{task.task_id}",
                        task=task,
                        n=cfg.rollouts_per_task,
                        min_policy_version=max(0, version - eta),
                    )
                    sequence += 1
                    # keyed by request, not task: with few tasks a task key left partitions (and the
                    # actors that own them) idle while work was queued on others
                    await bus.send(topics.ROLLOUT_REQUESTS, request, key=request.request_id)
                    flight.sent(request.request_id, time.monotonic())
                if picked:
                    await bus.metric("scheduler/requests", float(len(picked)), step=version)
                    await bus.metric("scheduler/running", float(flight.running), step=version)
                with anyio.move_on_after(cfg.poll_s):
                    await wake.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow_tasks, bus, pool, shutdown, poke)
            for loop in (follow_groups, follow_weights, emit):
                tg.start_soon(loop)
            await shutdown.wait()
            tg.cancel_scope.cancel()
