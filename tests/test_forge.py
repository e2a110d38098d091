"""forge: harder event with critic feedback, variant acceptance, table restored after a restart."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest

from consumers import forge
from infra.bus import Bus
from schemas import topics
from schemas.config import ForgeConfig, RunConfig
from schemas.events import (
    JudgedTrajectory,
    Judgement,
    Step,
    StepJudgement,
    TaskEvent,
    TaskSpec,
    Trajectory,
)
from tests.conftest import eventually, wait_records

PARENT = TaskSpec(task_id="p", domain="arith", difficulty=0, params={}, seed=1)
VARIANT = TaskSpec(
    task_id="v",
    domain="arith",
    difficulty=1,
    params={},
    seed=2,
    status="pending",
    parent_id="p",
    direction="harder",
    parent_accuracy=0.875,
    generation=1,
)


def rollout(
    task: TaskSpec, request_id: str, index: int, outcome: int, verdicts: list[list[int]]
) -> JudgedTrajectory:
    steps = [
        Step(
            index=k,
            prompt="p",
            response=f"action {index}.{k}",
            prompt_token_ids=[1],
            response_token_ids=[2],
            behaviour_logprobs=[-0.1],
            policy_version=0,
        )
        for k in range(len(verdicts))
    ]
    judgements = [
        StepJudgement(
            step_index=k,
            judgements=[
                Judgement(verdict=v, prompt_token_ids=[1], response_token_ids=[2], behaviour_logprobs=[-0.1])
                for v in vs
            ],
        )
        for k, vs in enumerate(verdicts)
    ]
    trajectory = Trajectory(
        request_id=request_id, rollout_index=index, group_size=8, task=task, steps=steps, outcome=outcome
    )
    return JudgedTrajectory(trajectory=trajectory, steps=judgements, reward_version=0)


def group(task: TaskSpec, request_id: str, successes: int) -> list[JudgedTrajectory]:
    """8 rollouts; the failed ones have step 1 judged -1 by every verdict (a high-risk step)."""
    return [
        rollout(
            task,
            request_id,
            i,
            1 if i < successes else -1,
            [[1, 1], [1, 1]] if i < successes else [[1, -1], [-1, -1]],
        )
        for i in range(8)
    ]


def test_decide_rules() -> None:
    cfg = ForgeConfig()
    window = forge.empty_window()
    window["rollouts"] = [forge.window_entry(j) for j in group(PARENT, "r", 7)]
    harder = forge.decide(PARENT, window, {"p": PARENT}, cfg, now=1000.0)
    assert harder.event is not None and harder.event.kind == "harder" and harder.event.accuracy == 0.875
    assert harder.event.critic.high_risk_steps == [[1]] and harder.event.critic.failed_actions == [
        "action 7.1"
    ]
    assert (
        forge.decide(PARENT, window, {"p": PARENT, "v": VARIANT}, cfg, now=1000.0).event is None
    )  # pending child
    window["last_event_at"] = 990.0
    assert forge.decide(PARENT, window, {"p": PARENT}, cfg, now=1000.0).event is None  # cooldown
    window = forge.empty_window()
    window["rollouts"] = [forge.window_entry(j) for j in group(VARIANT, "r", 8)]  # acc 1.0 >= acc_prev
    rejected = forge.decide(VARIANT, window, {"p": PARENT, "v": VARIANT}, cfg, now=0.0)
    assert rejected.event is not None and rejected.event.kind == "rejected"
    assert [(t.task_id, t.status, t.version) for t in rejected.updates] == [("v", "retired", 1)]


async def send_all(bus: Bus, values: list[JudgedTrajectory]) -> None:
    for value in values:
        await bus.send(topics.JUDGED, value, key=value.trajectory.request_id)


def kinds(events: list[TaskEvent]) -> list[tuple[str, str]]:
    return [(e.task_id, e.kind) for e in events]


@pytest.mark.timeout(120)
async def test_forge_app_events_acceptance_and_restart(kafka_config: Any) -> None:
    config = RunConfig(kafka=kafka_config, forge=ForgeConfig(partitions=2, event_cooldown_s=0.0))
    other = TaskSpec(task_id="q", domain="arith", difficulty=0, params={}, seed=3)
    async with Bus(kafka_config, role="test") as bus:
        await bus.send(topics.TASKS, PARENT, key="p")
        await bus.send(topics.TASKS, other, key="q")
        async with forge.running(config) as app:
            # one good record of a task nothing else uses first: the junk's offset is not 0
            await send_all(bus, group(msgspec.structs.replace(other, task_id="z"), "r0", 1)[:1])
            junk = await bus.producer.send_and_wait(
                bus.names.of(topics.JUDGED), b"\xc1 not msgpack", key=b"junk"
            )
            # --- 7 of 8 succeed: harder, with the failed rollout's high-risk step ---
            await send_all(bus, group(PARENT, "r1", 7))
            await send_all(bus, group(PARENT, "r1", 7)[:2])  # redelivered: not counted again
            events = await wait_records(bus, topics.TASK_EVENTS, lambda v: ("p", "harder") in kinds(v))
            [harder] = events
            assert (harder.accuracy, harder.rollouts, harder.critic.high_risk_steps) == (0.875, 8, [[1]])

            # --- the env model's pending variant reaches 4/8 < 0.875: accepted, parent retired ---
            await bus.send(topics.TASKS, VARIANT, key="v")
            await send_all(bus, group(VARIANT, "r2", 4))
            events = await wait_records(bus, topics.TASK_EVENTS, lambda v: ("v", "accepted") in kinds(v))
            tasks = {r.value.task_id: r.value for r in await bus.read_topic(topics.TASKS)}
            assert (tasks["v"].status, tasks["v"].version, tasks["p"].status, tasks["p"].version) == (
                "active",
                1,
                "retired",
                1,
            )
            assert msgspec.structs.replace(tasks["v"], status="pending", version=0, created_at=0.0) == (
                msgspec.structs.replace(VARIANT, created_at=0.0)
            )

            letters = await wait_records(bus, topics.DLQ, lambda v: len(v) >= 1)
            assert letters[0].value == b"\xc1 not msgpack" and letters[0].error.startswith("decode")
            # the record's real place in the source topic, not the repartition topic's
            source = (letters[0].source_topic, letters[0].partition, letters[0].offset, letters[0].key)
            assert source == (junk.topic, junk.partition, junk.offset, b"junk")

            # --- half a window of q, then a restart ---
            await send_all(bus, group(other, "r3", 1)[:3])
            # a success redriven for another group is not the forge's: counted, it would make 2/8
            copy = group(other, "r9", 8)[0]
            headers = {topics.REDRIVE_GROUP_HEADER: b"signals"}
            await bus.send(topics.JUDGED, copy, key=copy.trajectory.request_id, headers=headers)
            await eventually(
                lambda: len((app.table.get("q") or forge.empty_window())["rollouts"]) >= 3, 30, "q's rollouts"
            )

        # --- run() as the CLI does: the restored window + 5 new rollouts (1/8 succeed): easier ---
        shutdown = anyio.Event()
        await send_all(bus, group(other, "r3", 1)[3:])  # a backlog waits for the restart, as after a crash
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: forge.run(config, shutdown=shutdown))
            events = await wait_records(bus, topics.TASK_EVENTS, lambda v: ("q", "easier") in kinds(v))
            shutdown.set()
        easier = next(e for e in events if e.kind == "easier")
        assert (easier.accuracy, easier.rollouts, len(easier.critic.high_risk_steps)) == (0.125, 8, 7)
        assert kinds(events).count(("p", "harder")) == 1


def test_the_forges_faust_app_connects_as_the_bus_does() -> None:
    """faust takes credentials objects, not aiokafka's options: they carry the bus's own settings."""
    from schemas.config import KafkaConfig

    sasl = forge._credentials(
        KafkaConfig(
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="forge",
            sasl_password="secret",
        )
    )
    assert (sasl.username, sasl.password, sasl.mechanism.value) == ("forge", "secret", "SCRAM-SHA-512")
    assert sasl.ssl_context is not None
    plain_sasl = forge._credentials(KafkaConfig(security_protocol="SASL_PLAINTEXT", sasl_username="u"))
    assert plain_sasl.mechanism.value == "PLAIN" and plain_sasl.ssl_context is None
    assert forge._credentials(KafkaConfig(security_protocol="SSL")).context is not None
    assert forge._credentials(KafkaConfig()) is None
