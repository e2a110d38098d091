"""Bus runtime against the real embedded broker: typed send/consume, DLQ, dedup, commits, group failover.

Run as a script (`python tests/test_bus.py worker ...`) it is the worker process of the group test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from infra.bus import BatchConsumer, Bus, FatalError, Record, install_signal_handlers
from schemas import codec
from schemas import events as ev
from schemas import topics as T
from schemas.config import KafkaConfig
from tests.conftest import eventually

ROOT = Path(__file__).resolve().parent.parent


def request(i: int) -> ev.RolloutRequest:
    spec = ev.TaskSpec(task_id=f"t{i % 5}", domain="arith", difficulty=0, params={}, seed=i)
    return ev.RolloutRequest(request_id=f"r{i}", task=spec, n=2)


def metric(i: int, name: str = "m") -> ev.Metric:
    return ev.Metric(role="test", name=name, value=float(i), step=i)


async def consume_until(
    bus: Bus,
    topics: list[str],
    group: str,
    count: int,
    timeout_s: float = 20.0,
    handler_fault: Any = None,
    **kw: Any,
):
    """Consume with a group until `count` records were handled (`handler_fault(record)` runs first
    and may raise); returns them."""
    got: list[Record[Any]] = []
    done = anyio.Event()

    async def handler(record: Record[Any]) -> None:
        if handler_fault is not None:
            await handler_fault(record)
        got.append(record)
        if len(got) >= count:
            done.set()

    with anyio.fail_after(timeout_s):
        await bus.consume(topics, group=group, handler=handler, shutdown=done, **kw)
    return got


async def test_send_and_read_topic_finds_the_true_end(kafka_config: KafkaConfig) -> None:
    async with Bus(kafka_config, role="test") as bus:
        # pipelined sends make multi-record batches: Tansu's end_offsets undercounts those
        await bus.send_many(T.ROLLOUT_REQUESTS, [(f"k{i % 3}", request(i)) for i in range(300)])
        await bus.send(T.ROLLOUT_REQUESTS, request(300), key="k0", headers={"trace": b"x1"})
        records = await bus.read_topic(T.ROLLOUT_REQUESTS)
        assert sorted(r.value.request_id for r in records) == sorted(f"r{i}" for i in range(301))
        assert all(r.topic == T.ROLLOUT_REQUESTS and isinstance(r.value, ev.RolloutRequest) for r in records)
        last = next(r for r in records if r.value.request_id == "r300")
        assert last.headers == {"trace": b"x1"} and last.key == "k0" and last.timestamp_ms > 0
        assert await bus.read_topic(T.TASK_EVENTS) == []  # empty topic returns at once


async def test_read_topic_keeps_last_value_per_key_on_compacted_topics(kafka_config: KafkaConfig) -> None:
    async with Bus(kafka_config, role="test") as bus:
        for version in range(3):
            for model in ("policy", "reward"):
                event = ev.WeightsPublished(model=model, version=version, uri="u", sha256="ab" * 32, bytes=1)
                await bus.send(T.WEIGHTS, event, key=model)
        latest = await bus.read_topic(T.WEIGHTS)
        assert {(r.value.model, r.value.version) for r in latest} == {("policy", 2), ("reward", 2)}
        assert len(await bus.read_topic(T.WEIGHTS, latest_per_key=False)) == 6


async def test_send_refuses_invalid_or_mistyped_events(kafka_config: KafkaConfig) -> None:
    async with Bus(kafka_config, role="test") as bus:
        with pytest.raises(TypeError):
            await bus.send(T.TRAJECTORIES, metric(1), key="k")
        with pytest.raises(ValueError, match="step"):
            await bus.send(T.METRICS, ev.Metric(role="r", name="n", value=1.0, step=-1), key="k")
        with pytest.raises(ValueError):
            await bus.metric("learner/policy/loss", float("nan"))
        await bus.metric("learner/policy/loss", 0.25, step=3, model="policy")
        await bus.flush()
        (m,) = await bus.read_topic(T.METRICS)
        assert (m.key, m.value.role, m.value.name, m.value.value, m.value.step) == (
            "test",
            "test",
            "learner/policy/loss",
            0.25,
            3,
        )
        assert m.value.labels == {"model": "policy"}


async def test_bad_records_go_to_the_dlq_and_the_next_one_is_handled(kafka_config: KafkaConfig) -> None:
    from aiokafka import AIOKafkaProducer

    physical = kafka_config.topic_prefix + T.ROLLOUT_REQUESTS
    raw = AIOKafkaProducer(bootstrap_servers=kafka_config.bootstrap)
    await raw.start()
    try:
        garbage = os.urandom(64)
        wrong_schema = codec.encode(metric(1))
        coords = []
        for value in (garbage, wrong_schema, codec.encode(request(1)), codec.encode(request(2))):
            meta = await raw.send_and_wait(physical, value=value, key=b"same-key")  # one partition, in order
            coords.append((meta.partition, meta.offset))
    finally:
        await raw.stop()

    async with Bus(kafka_config, role="test") as bus:
        calls: list[str] = []

        async def handler(record: Record[ev.RolloutRequest]) -> None:
            calls.append(record.value.request_id)
            if record.value.request_id == "r1":
                raise RuntimeError("boom in handler")

        done = anyio.Event()

        async def until_r2(record: Record[ev.RolloutRequest]) -> None:
            await handler(record)
            if record.value.request_id == "r2":
                done.set()

        with anyio.fail_after(20):
            await bus.consume([T.ROLLOUT_REQUESTS], group="g-dlq", handler=until_r2, shutdown=done)
        assert calls == ["r1", "r2"]
        assert bus.stats["dead_letters"] == 3 and bus.stats["handled"] == 1
        letters = [r.value for r in await bus.read_topic(T.DLQ)]
        assert [(d.source_topic, d.partition, d.offset) for d in letters] == [
            (physical, p, o) for p, o in coords[:3]
        ]
        assert letters[0].value == garbage and letters[1].value == wrong_schema
        assert letters[0].key == b"same-key" and all(d.group == "g-dlq" for d in letters)
        assert (
            letters[0].error.startswith("decode")
            and "handler: RuntimeError: boom in handler" == letters[2].error
        )


async def test_fatal_errors_stop_the_consumer_without_committing(kafka_config: KafkaConfig) -> None:
    async with Bus(kafka_config, role="test") as bus:
        await bus.send(T.METRICS, metric(0), key="k")

        async def handler(record: Record[Any]) -> None:
            raise FatalError("out of memory, restart me")

        with pytest.raises(FatalError), anyio.fail_after(20):
            await bus.consume([T.METRICS], group="g-fatal", handler=handler)
        again = await consume_until(bus, [T.METRICS], "g-fatal", 1)  # not committed: redelivered
        assert again[0].offset == 0 and bus.stats["dead_letters"] == 0


async def test_transient_faults_are_retried_not_dead_lettered(kafka_config: KafkaConfig) -> None:
    """An OSError (a store read, a sandbox spawn), a MemoryError or torch's out-of-memory (a
    RuntimeError) is the moment's fault, not the record's: retried with backoff until it clears, the
    next record after it; a ValueError is the record's own and goes to the DLQ."""
    import torch

    async with Bus(kafka_config, role="test") as bus:
        await bus.send_many(T.METRICS, [("one-key", metric(i)) for i in range(3)])
        oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        faults = {
            0: [OSError("weight store unreachable"), MemoryError(), oom],
            1: [ValueError("bad in itself")],
        }
        calls: list[int] = []
        done = anyio.Event()

        async def handler(record: Record[ev.Metric]) -> None:
            calls.append(record.offset)
            pending = faults.get(record.offset)
            if pending:
                raise pending.pop(0)
            if record.offset == 2:
                done.set()

        with anyio.fail_after(30):
            await bus.consume([T.METRICS], group="g-transient", handler=handler, shutdown=done)
        assert calls == [0, 0, 0, 0, 1, 2]
        assert bus.stats["retries"] == 3 and bus.stats["dead_letters"] == 1 and bus.stats["handled"] == 2
        letters = [r.value for r in await bus.read_topic(T.DLQ)]
        assert [d.error for d in letters if d.group == "g-transient"] == [
            "handler: ValueError: bad in itself"
        ]


async def test_a_transient_fault_that_never_clears_stops_the_consumer_uncommitted(
    kafka_config: KafkaConfig,
) -> None:
    import msgspec

    kafka = msgspec.structs.replace(kafka_config, transient_retry_s=1.0)
    async with Bus(kafka, role="test") as bus:
        await bus.send(T.METRICS, metric(0), key="k")

        async def handler(record: Record[Any]) -> None:
            raise OSError("disk gone")

        with pytest.raises(FatalError, match="transient fault not cleared after 1 s"), anyio.fail_after(20):
            await bus.consume([T.METRICS], group="g-transient-stuck", handler=handler)
        assert bus.stats["retries"] >= 1 and bus.stats["dead_letters"] == 0
        again = await consume_until(bus, [T.METRICS], "g-transient-stuck", 1)  # not committed: redelivered
        assert again[0].offset == 0


async def test_a_record_whose_transient_fault_outlasts_its_strikes_is_dead_lettered(
    kafka_config: KafkaConfig,
) -> None:
    """Strikes live on forge.strikes, so they count across restarts (each consume below is one): the
    second round dead-letters the record and the consumer goes on to the next one."""
    kafka = msgspec.structs.replace(kafka_config, transient_retry_s=0.6, transient_strikes=2)
    async with Bus(kafka, role="test") as bus:
        await bus.send_many(T.METRICS, [("k", metric(0)), ("k", metric(1))])

        async def handler(record: Record[Any]) -> None:
            if record.offset == 0:
                raise OSError("weight store unreachable")

        with pytest.raises(FatalError, match="strike 1 of 2"), anyio.fail_after(20):
            await bus.consume([T.METRICS], group="g-strikes", handler=handler)
        assert bus.stats["dead_letters"] == 0
    async with Bus(kafka, role="test") as bus:  # the restarted role
        (later,) = await consume_until(bus, [T.METRICS], "g-strikes", 1, handler_fault=handler)
        assert later.offset == 1
        (letter,) = [r.value for r in await bus.read_topic(T.DLQ)]
        assert (letter.offset, letter.group) == (0, "g-strikes")
        assert (
            letter.error
            == "transient fault not cleared in 2 rounds of 0.6 s (OSError: weight store unreachable)"
        )
        (strike,) = [r.value for r in await bus.read_topic(T.STRIKES)]
        assert (strike.offset, strike.group, strike.error) == (
            0,
            "g-strikes",
            "OSError: weight store unreachable",
        )


async def test_a_group_beyond_a_partitions_end_reads_on_from_the_end(
    kafka_config: KafkaConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker that lost acknowledged records repeats their offsets. A group whose committed offset is
    beyond the partition's end waited there and skipped every record written below it (Tansu: no
    out-of-range reset); both group consumers now start at the end and say why."""
    from aiokafka import TopicPartition
    from aiokafka.structs import OffsetAndMetadata

    warned = "position 10 is beyond the partition's end 2"
    async with Bus(kafka_config, role="test") as bus:
        await bus.send_many(T.METRICS, [("k", metric(i)) for i in range(2)])
        tp = TopicPartition(bus.names.of(T.METRICS), (await bus.read_topic(T.METRICS))[0].partition)
        for group in ("g-beyond", "g-beyond-batch"):  # as if they had read 10 records the broker then lost
            consumer = bus._consumer(group)
            await consumer.start()
            consumer.assign([tp])
            await consumer.commit({tp: OffsetAndMetadata(10, "")})
            await consumer.stop()
        # the records' values, not offsets: the loss is reported as a metric on this same topic
        got: list[float] = []
        four = anyio.Event()

        async def handle(record: Record[Any]) -> None:
            got.extend([record.value.value] if record.value.name == "m" else [])
            if len(got) >= 4:
                four.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: bus.consume([T.METRICS], group="g-beyond", handler=handle, shutdown=four))
            with anyio.move_on_after(20):  # the group has its partitions (without the fix: no word, 20 s)
                await eventually(lambda: warned in caplog.text, 20, "the warning")
            await bus.send_many(T.METRICS, [("k", metric(i)) for i in range(2, 6)])  # offsets 2-5, below 10
            with anyio.fail_after(20):
                await four.wait()
        assert got == [2, 3, 4, 5]
        async with BatchConsumer(bus, [T.METRICS], group="g-beyond-batch") as batch:
            read: list[float] = []

            async def two() -> bool:
                batch_ = await batch.next_batch(10, timeout_s=0.5)
                read.extend(r.value.value for r in batch_ if r.value.name == "m")
                return len(read) >= 2

            async def joined() -> bool:  # starts at the end, 6
                await batch.next_batch(10, timeout_s=0.5)
                return caplog.text.count("is beyond the partition's end") == 2

            await eventually(joined, 30, "the batch consumer's assignment")
            await bus.send_many(T.METRICS, [("k", metric(i)) for i in range(6, 8)])
            await eventually(two, 30, "the batch consumer's records")
        assert read == [6, 7]
        assert bus.stats["offsets_lost"] == 8 + 4  # positions 10, ends 2 and (after 2-5) 6
        await bus.flush()
        lost = [r.value.value for r in await bus.read_topic(T.METRICS) if r.value.name == "bus/offsets_lost"]
        assert lost == [8.0, 4.0]
    assert caplog.text.count("is beyond the partition's end") == 2


async def test_duplicates_are_skipped_by_idempotency_key(kafka_config: KafkaConfig) -> None:
    async with Bus(kafka_config, role="test") as bus:
        # the same request twice (a producer retry), then a different one
        for i in (1, 1, 2, 1, 3):
            await bus.send(T.ROLLOUT_REQUESTS, request(i), key="k")
        seen = await consume_until(
            bus, [T.ROLLOUT_REQUESTS], "g-dedup", 3, idempotency_key=lambda r: r.value.request_id
        )
        assert [r.value.request_id for r in seen] == ["r1", "r2", "r3"]
        assert bus.stats["duplicates"] == 2


async def test_offsets_are_committed_after_the_handler_and_resumed(kafka_config: KafkaConfig) -> None:
    async with Bus(kafka_config, role="test") as bus:
        await bus.send_many(T.METRICS, [("one-key", metric(i)) for i in range(10)])
        release = anyio.Event()
        entered = anyio.Event()
        shutdown = anyio.Event()
        handled: list[int] = []

        async def slow(record: Record[ev.Metric]) -> None:
            if record.offset == 4:  # shutdown arrives while this one is in flight: it must finish
                entered.set()
                await release.wait()
            handled.append(record.offset)

        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: bus.consume([T.METRICS], group="g-commit", handler=slow, shutdown=shutdown))
            with anyio.fail_after(20):
                await entered.wait()
            shutdown.set()
            release.set()
        assert handled == [0, 1, 2, 3, 4]
        rest = await consume_until(bus, [T.METRICS], "g-commit", 5)
        assert [r.offset for r in rest] == [5, 6, 7, 8, 9]


async def test_follow_topic_sees_old_and_new_records(kafka_config: KafkaConfig) -> None:
    async with Bus(kafka_config, role="test") as bus:
        await bus.send(T.METRICS, metric(0), key="k")
        shutdown = anyio.Event()
        seen: list[float] = []
        with anyio.fail_after(20):
            async for record in bus.follow_topic(T.METRICS, shutdown=shutdown):
                seen.append(record.value.value)
                if len(seen) == 1:
                    await bus.send(T.METRICS, metric(1), key="k")
                else:
                    shutdown.set()
        assert seen == [0.0, 1.0]


async def test_follow_topic_reads_to_the_end_after_the_stop_when_asked(kafka_config: KafkaConfig) -> None:
    # `up` folds the progress topics with it: records written while the roles stop (or not yet fetched when
    # the stop came) still reach the run's summary
    async with Bus(kafka_config, role="test") as bus:
        await bus.send_many(T.METRICS, [("k", metric(i)) for i in range(3)])
        stopped = anyio.Event()
        stopped.set()
        with anyio.fail_after(30):
            drained = [
                r.value.value async for r in bus.follow_topic(T.METRICS, shutdown=stopped, drain_s=10.0)
            ]
            plain = [r.value.value async for r in bus.follow_topic(T.METRICS, shutdown=stopped)]
        assert drained == [0.0, 1.0, 2.0]
        assert plain == []


async def test_batch_consumer_commit_and_seek(kafka_config: KafkaConfig) -> None:
    async with Bus(kafka_config, role="test") as bus:
        await bus.send_many(
            T.SAMPLES_POLICY, [("k", ev.PolicySampleBatch(request_id=f"r{i}", samples=[])) for i in range(6)]
        )
        await bus.producer.send_and_wait(kafka_config.topic_prefix + T.SAMPLES_POLICY, b"junk", key=b"k")

        async def drain(consumer: Any, n: int) -> list[Record[Any]]:
            got: list[Record[Any]] = []
            with anyio.fail_after(20):
                while len(got) < n:
                    got += await consumer.next_batch(100, timeout_s=0.5)
            return got

        async with BatchConsumer(bus, [T.SAMPLES_POLICY], group="learner") as consumer:
            got = await drain(consumer, 6)
            assert [r.value.request_id for r in got] == [f"r{i}" for i in range(6)]
            partition = got[0].partition
            await consumer.commit({(T.SAMPLES_POLICY, partition): 3})  # checkpoint covers r0..r2
        async with BatchConsumer(bus, [T.SAMPLES_POLICY], group="learner") as consumer:
            got = await drain(consumer, 3)
            assert [r.value.request_id for r in got] == ["r3", "r4", "r5"]
            await consumer.seek({(T.SAMPLES_POLICY, partition): 1})  # restore an older checkpoint
            got = await drain(consumer, 5)
            assert [r.value.request_id for r in got] == ["r1", "r2", "r3", "r4", "r5"]
            assert (T.SAMPLES_POLICY, partition) in consumer.assignment()
        assert bus.stats["dead_letters"] >= 1  # the junk record


# --- a consumer group of two processes over 8 partitions, one killed with SIGKILL mid-stream ---

N_EVENTS = 400


def worker_main(bootstrap: str, prefix: str, worker: str) -> None:
    """Handle rollout requests slowly; each one produces one effect (a Metric labelled with its id)."""
    kafka = KafkaConfig(
        bootstrap=bootstrap, topic_prefix=prefix, session_timeout_s=6.0, heartbeat_interval_s=0.5
    )

    async def main() -> None:
        shutdown = anyio.Event()
        install_signal_handlers(shutdown)
        async with Bus(kafka, role=worker) as bus:

            async def handle(record: Record[ev.RolloutRequest]) -> None:
                await anyio.sleep(0.02)
                effect = ev.Metric(
                    role=worker, name="effect", value=1.0, labels={"id": record.value.request_id}
                )
                await bus.send(T.METRICS, effect, key=record.value.request_id)

            await bus.consume(
                [T.ROLLOUT_REQUESTS],
                group="workers",
                handler=handle,
                idempotency_key=lambda r: r.value.request_id,
                shutdown=shutdown,
            )

    anyio.run(main)


async def test_group_of_two_processes_survives_kill_9(kafka_config: KafkaConfig) -> None:
    async with Bus(kafka_config, role="test") as bus:
        await bus.send_many(T.ROLLOUT_REQUESTS, [(f"key{i}", request(i)) for i in range(N_EVENTS)])
        procs = {
            name: subprocess.Popen(
                [sys.executable, __file__, "worker", kafka_config.bootstrap, kafka_config.topic_prefix, name],
                cwd=ROOT,
                env=os.environ | {"PYTHONPATH": str(ROOT)},
            )
            for name in ("w1", "w2")
        }
        try:
            effects: list[ev.Metric] = []

            async def effects_by(need_total: int, need_both: bool = False) -> bool:
                effects[:] = [r.value for r in await bus.read_topic(T.METRICS)]
                roles = {e.role for e in effects}
                return len({e.labels["id"] for e in effects}) >= need_total and (
                    not need_both or len(roles) == 2
                )

            await eventually(lambda: effects_by(60, need_both=True), 40, "both workers to produce effects")
            procs["w1"].send_signal(signal.SIGKILL)
            procs["w1"].wait(5)
            done_before_kill = Counter(e.role for e in effects)
            await eventually(lambda: effects_by(N_EVENTS), 60, "every event to be handled")
            assert Counter(e.role for e in effects)["w2"] > done_before_kill["w2"]
        finally:
            for p in procs.values():
                p.send_signal(signal.SIGTERM)
            for p in procs.values():
                p.wait(20)
        assert procs["w2"].returncode == 0  # graceful exit on SIGTERM

        # count effects, not deliveries: a deduplicating consumer applies each id exactly once
        deliveries = len(await bus.read_topic(T.METRICS))  # workers are stopped: this is final
        applied: Counter[str] = Counter()
        done = anyio.Event()

        async def apply(record: Record[ev.Metric]) -> None:
            applied[record.value.labels["id"]] += 1

        async def until_all_delivered() -> None:
            while bus.stats["handled"] + bus.stats["duplicates"] < deliveries:
                await anyio.sleep(0.05)
            done.set()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(until_all_delivered)
                await bus.consume(
                    [T.METRICS],
                    group="checker",
                    handler=apply,
                    shutdown=done,
                    idempotency_key=lambda r: r.value.labels["id"],
                )
        assert set(applied) == {f"r{i}" for i in range(N_EVENTS)}
        assert set(applied.values()) == {1}
        assert bus.stats["duplicates"] == deliveries - N_EVENTS


# --- a client that is not ours reads what we wrote ---


async def test_confluent_kafka_reads_our_topic(kafka_config: KafkaConfig) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    async with Bus(kafka_config, role="test") as bus:
        await bus.send_many(
            T.TRAJECTORIES,
            [(f"r{i}", msgspec.structs.replace(traj(), request_id=f"r{i}")) for i in range(20)],
        )

    def read_all() -> list[tuple[str, ev.Trajectory]]:
        topic = kafka_config.topic_prefix + T.TRAJECTORIES
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": kafka_config.bootstrap,
                "group.id": "peer",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(8)]
        )
        out = []
        deadline = time.monotonic() + 20
        while len(out) < 20 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            out.append((msg.key().decode(), codec.decode(msg.value(), ev.Trajectory)))
        consumer.close()
        return out

    got = await anyio.to_thread.run_sync(read_all)
    assert sorted(k for k, _ in got) == sorted(f"r{i}" for i in range(20))
    assert all(t.request_id == k and t.steps[0].behaviour_logprobs == [-0.5] for k, t in got)


def traj() -> ev.Trajectory:
    spec = ev.TaskSpec(task_id="t", domain="household", difficulty=0, params={"rooms": 1}, seed=1)
    step = ev.Step(
        index=0,
        prompt="p",
        response="r",
        prompt_token_ids=[1],
        response_token_ids=[2],
        behaviour_logprobs=[-0.5],
        policy_version=0,
    )
    return ev.Trajectory(request_id="r", rollout_index=0, group_size=1, task=spec, steps=[step], outcome=1)


def test_security_settings_reach_the_client() -> None:
    """SASL cannot be exercised on this Tansu build (FACTS): check the wiring handed to aiokafka."""
    from infra.bus import client_options, consumer_options

    kafka = KafkaConfig(
        bootstrap="k1:9093,k2:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="forge",
        sasl_password="secret",
        session_timeout_s=20,
    )
    opts = client_options(kafka)
    assert opts["security_protocol"] == "SASL_SSL" and opts["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (opts["sasl_plain_username"], opts["sasl_plain_password"]) == ("forge", "secret")
    assert opts["ssl_context"] is not None and opts["bootstrap_servers"] == "k1:9093,k2:9093"
    consumer = consumer_options(kafka, "g")
    assert consumer["enable_auto_commit"] is False and consumer["session_timeout_ms"] == 20_000
    assert consumer["request_timeout_ms"] > consumer["session_timeout_ms"]
    assert "sasl_mechanism" not in client_options(KafkaConfig())


async def test_idempotent_producer_on_tansu_is_a_clear_error(kafka_config: KafkaConfig) -> None:
    if os.environ.get("FORGESTREAM_TEST_BOOTSTRAP"):
        pytest.skip("real Kafka accepts idempotent producers")
    kafka = msgspec.structs.replace(kafka_config, idempotent_producer=True)
    with pytest.raises(FatalError, match="idempotent_producer = false"):
        async with Bus(kafka, role="test"):
            pass


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "worker":
    worker_main(*sys.argv[2:])
