"""Env model: eligibility, proposing rules, and run() against the real broker."""

from __future__ import annotations

import functools
import os
import random
from typing import Any

import anyio
import msgspec
import pytest

from consumers import env_model
from consumers.env_model import candidates, choose, solvable
from envs import get_environment
from infra.bus import Bus
from pipeline.taskpool import TaskPool
from schemas import topics
from schemas.config import EnvModelConfig, ModelConfig, RunConfig
from schemas.events import TaskEvent, TaskSpec
from tests.conftest import wait_records

ENV = get_environment("household")


def household_task(seed: int, difficulty: int = 1) -> TaskSpec:
    return ENV.sample_task(difficulty, random.Random(seed))


def event(task: TaskSpec, kind: str, accuracy: float, event_id: str) -> TaskEvent:
    return TaskEvent(
        event_id=event_id,
        task_id=task.task_id,
        task_version=task.version,
        kind=kind,
        accuracy=accuracy,
        rollouts=8,
    )  # type: ignore[arg-type]


@pytest.fixture
def model_home(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tiny presets built once per test session (unless FORGESTREAM_HOME already points at a cache)."""
    if not os.environ.get("FORGESTREAM_HOME"):
        monkeypatch.setenv("FORGESTREAM_HOME", str(tmp_path_factory.getbasetemp() / "forgestream-home"))


# --- pure parts ----------------------------------------------------------------------------------
def test_only_active_tasks_without_a_pending_child_are_eligible() -> None:
    a, b = household_task(1), household_task(2)
    child = msgspec.structs.replace(household_task(3), status="pending", parent_id=b.task_id)
    retired = msgspec.structs.replace(household_task(4), status="retired")
    pool = TaskPool()
    for t in (a, b, child, retired):
        pool.update(t)
    assert pool.eligible(a.task_id) == a
    assert pool.eligible(b.task_id) is None  # has a pending child
    assert pool.eligible(child.task_id) is None  # pending itself
    assert pool.eligible(retired.task_id) is None
    assert pool.eligible("unknown") is None
    assert pool.live_signatures() == {a.signature, b.signature, child.signature}


def test_candidates_are_new_solvable_pending_variants_and_refuse_taken_signatures() -> None:
    parent = household_task(5)
    ev = event(parent, "harder", 1.0, "e1")
    found, _ = candidates(ENV, parent, ev, {parent.signature}, random.Random(0), attempts=8, want=1)
    assert len(found) == 1
    variant = found[0]
    assert variant.status == "pending" and variant.parent_id == parent.task_id
    assert variant.direction == "harder" and variant.parent_accuracy == 1.0
    assert variant.signature == ENV.signature(variant) != parent.signature
    assert variant.generation == parent.generation + 1
    assert solvable(ENV, variant)
    # the same rng proposes the same variant; once its signature is taken it is refused
    again, refused = candidates(
        ENV, parent, ev, {parent.signature, variant.signature}, random.Random(0), attempts=1, want=1
    )
    assert again == [] and refused["duplicate"] == 1


def test_choose_reads_the_boxed_index_and_falls_back_to_the_first() -> None:
    assert choose("the second one \\boxed{1}", 3) == 1
    assert choose("\\boxed{7}", 3) == 0
    assert choose("no idea", 3) == 0


# --- run() against the broker --------------------------------------------------------------------


@pytest.mark.timeout(90)
async def test_harder_event_becomes_a_pending_variant_and_ineligible_tasks_are_ignored(
    kafka_config: Any, tmp_path: Any
) -> None:
    parent, busy = household_task(11), household_task(12)
    busy_child = msgspec.structs.replace(household_task(13), status="pending", parent_id=busy.task_id)
    config = RunConfig(workdir=str(tmp_path), kafka=kafka_config)
    shutdown = anyio.Event()
    async with Bus(kafka_config, role="test") as bus, anyio.create_task_group() as tg:
        for t in (parent, busy, busy_child):
            await bus.send(topics.TASKS, t, key=t.task_id)
        tg.start_soon(functools.partial(env_model.run, config, shutdown=shutdown))
        for ev in (
            event(busy, "harder", 0.9, "ev-busy"),  # has a pending child: ignored
            event(parent, "accepted", 0.5, "ev-accepted"),  # not a harder/easier event: ignored
            event(parent, "harder", 0.875, "ev-parent"),
            event(parent, "harder", 0.875, "ev-parent"),  # redelivered: deduplicated
            # marker, same key (partition) after the redelivery: the parent now has a pending child
            event(parent, "easier", 0.1, "ev-marker"),
        ):
            await bus.send(topics.TASK_EVENTS, ev, key=ev.task_id)

        def variants_of(tasks: list[TaskSpec], parent_id: str) -> list[TaskSpec]:
            return [t for t in tasks if t.parent_id == parent_id]

        tasks = await wait_records(bus, topics.TASKS, lambda v: len(variants_of(v, parent.task_id)) >= 1)
        # both ineligible events handled (busy, then the marker): everything before the marker was too
        await wait_records(
            bus, topics.METRICS, lambda v: sum(m.name == "env_model/ineligible" for m in v) >= 2
        )
        tasks = [r.value for r in await bus.read_topic(topics.TASKS)]
        (variant,) = variants_of(tasks, parent.task_id)
        assert variant.status == "pending" and variant.direction == "harder"
        assert variant.parent_accuracy == 0.875
        assert variant.signature not in {parent.signature, busy.signature, busy_child.signature}
        assert variants_of(tasks, busy.task_id) == [busy_child]
        shutdown.set()


@pytest.mark.timeout(120)
async def test_llm_env_model_picks_among_rule_candidates(
    kafka_config: Any, model_home: None, tmp_path: Any
) -> None:
    parent = household_task(21, difficulty=2)  # has three distinct easier variants
    config = RunConfig(
        workdir=str(tmp_path),
        kafka=kafka_config,
        env_model=EnvModelConfig(kind="llm", llm_candidates=3),
        policy_model=ModelConfig(bootstrap_sft_seconds=5, max_new_tokens=8),
    )
    shutdown = anyio.Event()
    async with Bus(kafka_config, role="test") as bus, anyio.create_task_group() as tg:
        await bus.send(topics.TASKS, parent, key=parent.task_id)
        tg.start_soon(functools.partial(env_model.run, config, shutdown=shutdown))
        ev = event(parent, "easier", 0.0, "ev-llm")
        await bus.send(topics.TASK_EVENTS, ev, key=ev.task_id)
        tasks = await wait_records(  # includes building the tiny policy preset
            bus, topics.TASKS, lambda v: any(t.parent_id == parent.task_id for t in v), timeout=100
        )
        (variant,) = [t for t in tasks if t.parent_id == parent.task_id]
        assert variant.status == "pending" and variant.direction == "easier"
        assert variant.signature != parent.signature and solvable(ENV, variant)
        metrics = await wait_records(
            bus, topics.METRICS, lambda v: any(m.name == "env_model/llm_choice" for m in v)
        )
        (choice,) = [m.value for m in metrics if m.name == "env_model/llm_choice"]
        assert choice in (0.0, 1.0, 2.0)
        shutdown.set()
