"""Typed bus runtime over aiokafka: every role produces and consumes through this module.

Consumes: any forgestream topic (logical names from `schemas.topics`). Produces: the caller's
events, `forge.metrics` (`Bus.metric`) and `forge.dlq` (dead letters).

Invariants:
- at-least-once: an offset is committed only after the handler for that record returned (and the
  handler awaits its own sends), or after its DeadLetter was acknowledged;
- one bad record never stops a consumer: a decode failure or a handler exception becomes a
  DeadLetter (raw bytes, error, source physical topic/partition/offset) and the loop goes on.
  Exceptions that mean "the process is unhealthy" propagate instead: `FatalError`, any
  `aiokafka.errors.KafkaError` (broker gone: restart and redeliver) and cancellation;
- a transient fault is not the record's fault: a handler raising `TRANSIENT` (`TransientError`, an
  OSError such as a failed read or spawn, MemoryError) is retried with backoff, its offset
  uncommitted; if it has not cleared after `KafkaConfig.transient_retry_s` the consumer stops with a
  FatalError (the role restarts and the record is redelivered); never dead-lettered;
- redelivered records whose idempotency key this process already handled are skipped (LRU window of
  `KafkaConfig.dedup_window` keys); effects that must survive restarts are deduplicated downstream;
- shutdown (the event, e.g. set by SIGTERM): stop fetching, finish the in-flight record, commit,
  leave the group;
- producers are neither idempotent nor transactional unless `KafkaConfig.idempotent_producer`
  (Tansu rejects InitProducerId from aiokafka).
"""

from __future__ import annotations

import logging
import signal
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio
import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata

from schemas import codec
from schemas.config import KafkaConfig
from schemas.events import DeadLetter, Metric, finite
from schemas.topics import DLQ, METRICS, TOPICS, Topic, TopicNames

log = logging.getLogger("forgestream.bus")
E = TypeVar("E", bound=msgspec.Struct)
_DLQ_HEADROOM = 64 << 10  # bytes kept free in a dead letter for its metadata


class FatalError(Exception):
    """Raised by a handler to stop the consumer (and the process) instead of dead-lettering a record."""


class TransientError(Exception):
    """Raised by a handler for a fault of the moment (a store, a sandbox, a peer that did not answer):
    the record is retried, never dead-lettered."""


TRANSIENT: tuple[type[BaseException], ...] = (TransientError, OSError, MemoryError)
_RETRY_FIRST_S, _RETRY_MAX_S = 0.5, 30.0


@dataclass(frozen=True, slots=True)
class Record(Generic[E]):
    topic: str  # LOGICAL name, e.g. schemas.topics.TRAJECTORIES
    partition: int
    offset: int
    key: str | None
    value: E  # decoded Struct of TOPICS[topic].value_type
    timestamp_ms: int
    headers: dict[str, bytes] = field(default_factory=dict)


def client_options(kafka: KafkaConfig) -> dict[str, Any]:
    """Connection settings shared by producers, consumers and admin clients."""
    opts: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap,
        "client_id": kafka.client_id,
        "security_protocol": kafka.security_protocol,
    }
    if kafka.security_protocol in ("SSL", "SASL_SSL"):
        from aiokafka.helpers import create_ssl_context

        opts["ssl_context"] = create_ssl_context(cafile=kafka.ssl_cafile)
    if kafka.security_protocol.startswith("SASL"):
        opts["sasl_mechanism"] = kafka.sasl_mechanism or "PLAIN"
        opts["sasl_plain_username"] = kafka.sasl_username
        opts["sasl_plain_password"] = kafka.sasl_password
    return opts


def consumer_options(kafka: KafkaConfig, group: str | None) -> dict[str, Any]:
    session_ms = int(kafka.session_timeout_s * 1000)
    return client_options(kafka) | {
        # The topic prefix namespaces groups too: two runs sharing a cluster never share "actors".
        "group_id": None if group is None else kafka.topic_prefix + group,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "session_timeout_ms": session_ms,
        "heartbeat_interval_ms": int(min(kafka.heartbeat_interval_s, kafka.session_timeout_s / 3) * 1000),
        "max_poll_interval_ms": int(kafka.max_poll_interval_s * 1000),
        # aiokafka requires request timeout > session timeout
        "request_timeout_ms": int(max(kafka.request_timeout_s, kafka.session_timeout_s + 5) * 1000),
        "max_partition_fetch_bytes": kafka.max_message_bytes,
        "fetch_max_bytes": max(kafka.max_message_bytes, 50 << 20),
    }


def install_signal_handlers(shutdown: anyio.Event) -> Callable[[], None]:
    """SIGTERM/SIGINT set `shutdown` (graceful); a second signal gets the default action (hard stop).

    Call from inside the running event loop (main thread). Returns a function that removes them.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    sigs = (signal.SIGTERM, signal.SIGINT)

    def on_signal(sig: signal.Signals) -> None:
        log.warning("%s received: finishing in-flight work, then stopping", sig.name)
        shutdown.set()
        for s in sigs:  # the next signal is not caught: default action
            loop.remove_signal_handler(s)

    for s in sigs:
        loop.add_signal_handler(s, on_signal, s)

    def remove() -> None:
        for s in sigs:
            loop.remove_signal_handler(s)

    return remove


async def _fetch(
    consumer: AIOKafkaConsumer, shutdown: anyio.Event | None, timeout_s: float, max_records: int
) -> dict[TopicPartition, list[ConsumerRecord]]:
    """One getmany that returns early (empty) when `shutdown` is set; cancelling getmany loses nothing."""
    if shutdown is None:
        return await consumer.getmany(timeout_ms=int(timeout_s * 1000), max_records=max_records)
    if shutdown.is_set():
        return {}
    result: dict[TopicPartition, list[ConsumerRecord]] = {}
    async with anyio.create_task_group() as tg:

        async def fetch() -> None:
            nonlocal result
            result = await consumer.getmany(timeout_ms=int(timeout_s * 1000), max_records=max_records)
            tg.cancel_scope.cancel()

        async def watch() -> None:
            await shutdown.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(fetch)
        tg.start_soon(watch)
    return result


async def stop_consumer(consumer: AIOKafkaConsumer, via: AIOKafkaProducer | None, timeout_s: float) -> None:
    """Stop a group consumer and make sure it left the group.

    aiokafka sends LeaveGroup only when its generation is > 0, but Tansu numbers the first generation
    0: without this, the next member to join waits for our session to expire (measured: 11 s instead
    of 3 s with a 6 s session timeout). We send that LeaveGroup ourselves through the bus producer's
    connection once the consumer has stopped (aiokafka internals: `_coordinator`, read-only here).
    """
    coordinator = getattr(consumer, "_coordinator", None)
    gen0 = getattr(coordinator, "generation", None) == 0
    member = getattr(coordinator, "member_id", "") if gen0 else ""
    node = getattr(coordinator, "coordinator_id", None)
    group = getattr(coordinator, "group_id", None)
    with anyio.CancelScope(shield=True), anyio.move_on_after(timeout_s):
        await consumer.stop()
        if member and node is not None and group and via is not None:
            from aiokafka.client import ConnectionGroup
            from aiokafka.protocol.group import LeaveGroupRequest

            try:
                await via.client.send(
                    node, LeaveGroupRequest(group, member), group=ConnectionGroup.COORDINATION
                )
            except KafkaError as e:
                log.info(
                    "LeaveGroup for %s failed (%s): the group rebalances after the session timeout", group, e
                )


async def true_end_offsets(
    consumer: AIOKafkaConsumer, tps: list[TopicPartition], timeout_s: float = 10.0
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """(beginning, end) per partition, right on Tansu and on Kafka; assigns `tps` to the (group-less)
    consumer and leaves them paused or positioned anywhere: seek before reading.

    `end` is the high watermark of a Fetch response, never ListOffsets(latest): Tansu answers that
    with the first offset of the last record batch + 1, too small whenever the last batch holds more
    than one record (measured: 15 records in 3 batches -> 11). ListOffsets gives only a hint `h`:
    `h == beginning` means empty (true on both brokers); otherwise one fetch from `h - 1` (inside the
    last batch on Tansu, the last record on Kafka) returns the high watermark."""
    consumer.assign(tps)
    begins = await consumer.beginning_offsets(tps)
    hints = await consumer.end_offsets(tps)
    ends = {tp: hints[tp] for tp in tps}
    probe = [tp for tp in tps if hints[tp] > begins[tp]]
    for tp in probe:
        consumer.seek(tp, hints[tp] - 1)
    consumer.pause(*[tp for tp in tps if tp not in probe])
    deadline = time.monotonic() + timeout_s
    waiting = set(probe)
    while waiting and time.monotonic() < deadline:
        await consumer.getmany(*waiting, timeout_ms=200, max_records=1)
        for tp in list(waiting):
            highwater = consumer.highwater(tp)
            if highwater is not None:
                ends[tp] = max(highwater, hints[tp])
                waiting.discard(tp)
    if waiting:
        raise TimeoutError(f"no fetch response with a high watermark for {sorted(waiting)}")
    return begins, ends


class RecentKeys:
    """Bounded LRU set of keys (idempotency keys, finished ids): memory stays flat on a long run."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: str) -> bool:
        if key in self._keys:
            self._keys.move_to_end(key)
            return True
        return False

    def add(self, key: str) -> None:
        if self.size == 0:
            return
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self.size:
            self._keys.popitem(last=False)


class _Offsets(ConsumerRebalanceListener):
    """Next offsets to commit, per partition; commits what was handled before partitions move away."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer
        self.pending: dict[TopicPartition, int] = {}
        self.last_commit = time.monotonic()

    def mark(self, tp: TopicPartition, next_offset: int) -> None:
        self.pending[tp] = next_offset

    async def commit(self, only: Iterable[TopicPartition] | None = None) -> None:
        tps = list(self.pending) if only is None else [tp for tp in only if tp in self.pending]
        if not tps:
            return
        offsets = {tp: OffsetAndMetadata(self.pending.pop(tp), "") for tp in tps}
        self.last_commit = time.monotonic()
        try:
            await self.consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError) as e:
            # the partitions moved to another member: it resumes from the last successful commit and
            # redelivers the rest (at-least-once; duplicates are dropped by idempotency keys)
            log.warning("commit of %s failed after a rebalance: %s", offsets, e)

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.commit(revoked)
        for tp in revoked:
            self.pending.pop(tp, None)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        pass


def _assign_all(consumer: AIOKafkaConsumer, physical: str) -> list[TopicPartition]:
    """Assign every partition of `physical` (no group); KeyError if the topic does not exist."""
    partitions = sorted(consumer.partitions_for_topic(physical) or ())
    if not partitions:
        raise KeyError(f"topic {physical!r} does not exist (create topics first)")
    tps = [TopicPartition(physical, p) for p in partitions]
    consumer.assign(tps)
    return tps


class Bus:
    """One per process: a typed producer plus factories for typed consumers."""

    def __init__(self, kafka: KafkaConfig, *, role: str) -> None:
        self.kafka = kafka
        self.role = role
        self.names = TopicNames(kafka.topic_prefix)
        self.stats = {"sent": 0, "handled": 0, "duplicates": 0, "dead_letters": 0, "retries": 0}
        self._producer: AIOKafkaProducer | None = None

    # --- lifecycle ---
    async def __aenter__(self) -> Bus:
        self._producer = AIOKafkaProducer(
            **client_options(self.kafka),
            acks="all",
            enable_idempotence=self.kafka.idempotent_producer,
            max_request_size=self.kafka.max_message_bytes,
            request_timeout_ms=int(self.kafka.request_timeout_s * 1000),
        )
        try:
            await self._producer.start()
        except KafkaError as e:
            with anyio.CancelScope(shield=True):
                await self._producer.stop()
            self._producer = None
            if self.kafka.idempotent_producer:
                raise FatalError(
                    f"kafka.idempotent_producer is on but the broker refused InitProducerId ({e}); "
                    "Tansu does not support it from aiokafka: set kafka.idempotent_producer = false"
                ) from e
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.kafka.request_timeout_s):
                await producer.stop()  # flushes pending sends

    @property
    def producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError("use the Bus as `async with Bus(...) as bus:` before sending")
        return self._producer

    # --- producing ---
    def _encode(self, topic: str, value: msgspec.Struct) -> bytes:
        value_type = TOPICS[topic].value_type if topic in TOPICS else None
        if value_type is None:
            raise KeyError(f"unknown topic {topic!r}; known: {sorted(TOPICS)}")
        if type(value) is not value_type:
            raise TypeError(f"{topic} carries {value_type.__name__}, not {type(value).__name__}")
        data = codec.encode(value)
        try:  # constraints are checked on decode only: refuse to put an event on the wire nobody can read
            codec.decode(data, value_type)
        except codec.DecodeError as e:
            raise ValueError(f"refusing to send an invalid {value_type.__name__} to {topic}: {e}") from None
        return data

    async def _send_raw(self, physical: str, data: bytes, key: str, headers: dict[str, bytes] | None) -> Any:
        return await self.producer.send(
            physical,
            value=data,
            key=key.encode(),
            headers=list((headers or {}).items()) or None,
        )

    async def send(
        self, topic: Topic[E], value: E, *, key: str, headers: dict[str, bytes] | None = None
    ) -> None:
        """Encode, validate and send one event to a logical topic; returns once the broker acked it."""
        data = self._encode(topic, value)
        ack = await self._send_raw(self.names.of(topic), data, key, headers)
        await ack
        self.stats["sent"] += 1

    async def send_many(self, topic: Topic[E], items: Iterable[tuple[str, E]]) -> None:
        """Send (key, event) pairs as one pipelined burst; returns once every one is acked."""
        physical = self.names.of(topic)
        acks = [await self._send_raw(physical, self._encode(topic, value), key, None) for key, value in items]
        for ack in acks:
            await ack
        self.stats["sent"] += len(acks)

    async def metric(self, name: str, value: float, *, step: int = 0, **labels: str) -> None:
        """Publish one Metric (key = role) to forge.metrics; a non-finite value is a ValueError.

        Does not wait for the ack, so the metrics a role emits together go out as one produce request
        (awaiting each made every metric a request of its own: in an `up` on the embedded durable
        broker, 60 % of the objects it stored); a failed send is logged, `flush` and leaving the Bus
        deliver the rest."""
        event = Metric(role=self.role, name=name, value=finite(float(value)), step=step, labels=labels)
        ack = await self._send_raw(self.names.of(METRICS), self._encode(METRICS, event), self.role, None)
        ack.add_done_callback(self._metric_sent)

    def _metric_sent(self, ack: Any) -> None:
        if ack.cancelled() or ack.exception() is not None:
            log.warning("metric not delivered: %s", "cancelled" if ack.cancelled() else ack.exception())
        else:
            self.stats["sent"] += 1

    async def flush(self) -> None:
        """Wait until every send so far (metrics included) is acked."""
        await self.producer.flush()

    async def dead_letter(self, raw: ConsumerRecord, error: str, *, group: str = "") -> None:
        """Send a raw record that could not be handled to forge.dlq (awaits the ack)."""
        self.stats["dead_letters"] += 1
        log.warning("dead letter %s[%d]@%d: %s", raw.topic, raw.partition, raw.offset, error)
        if not self.kafka.dlq_enabled:
            return
        value = raw.value
        limit = self.kafka.max_message_bytes - _DLQ_HEADROOM
        if value is not None and len(value) > limit:
            error += f" (value truncated from {len(value)} bytes)"
            value = value[:limit]
        letter = DeadLetter(
            source_topic=raw.topic,
            partition=raw.partition,
            offset=raw.offset,
            key=raw.key,
            value=value,
            error=error[:10_000],
            group=group,
        )
        await self.send(DLQ, letter, key=raw.topic)

    # --- decoding ---
    def decode(self, raw: ConsumerRecord) -> Record[Any]:
        """Raw aiokafka record -> typed Record; raises codec.DecodeError / UnicodeDecodeError."""
        logical = self.names.logical(raw.topic)
        value = codec.decode(raw.value if raw.value is not None else b"", TOPICS[logical].value_type)
        return Record(
            topic=logical,
            partition=raw.partition,
            offset=raw.offset,
            key=raw.key.decode() if raw.key is not None else None,
            value=value,
            timestamp_ms=raw.timestamp,
            headers=dict(raw.headers or ()),
        )

    def _consumer(self, group: str | None) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(**consumer_options(self.kafka, group))

    # --- group consumer loop ---
    async def consume(
        self,
        topics: list[Topic[E]],
        *,
        group: str,
        handler: Callable[[Record[E]], Awaitable[None]],
        idempotency_key: Callable[[Record[E]], str] | None = None,
        shutdown: anyio.Event | None = None,
        max_records: int = 256,
    ) -> None:
        """Group consumer loop until `shutdown` is set (see the module docstring for the guarantees)."""
        consumer = self._consumer(group)
        offsets = _Offsets(consumer)
        seen = RecentKeys(self.kafka.dedup_window if idempotency_key is not None else 0)
        consumer.subscribe([self.names.of(t) for t in topics], listener=offsets)
        await consumer.start()
        try:
            while shutdown is None or not shutdown.is_set():
                batch = await _fetch(consumer, shutdown, 1.0, max_records)
                for tp, raws in batch.items():
                    for raw in raws:
                        if shutdown is not None and shutdown.is_set():
                            break
                        if tp not in consumer.assignment():
                            break  # revoked while we were busy: the new owner redelivers
                        if not await self._handle(raw, group, handler, idempotency_key, seen, shutdown):
                            break  # shut down while retrying: uncommitted, redelivered after restart
                        offsets.mark(tp, raw.offset + 1)
                        if time.monotonic() - offsets.last_commit >= self.kafka.commit_interval_s:
                            await offsets.commit()
                if not batch or time.monotonic() - offsets.last_commit >= self.kafka.commit_interval_s:
                    await offsets.commit()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.kafka.request_timeout_s):
                try:
                    await offsets.commit()
                finally:  # leave the group: partitions move at once
                    await stop_consumer(consumer, self._producer, self.kafka.request_timeout_s)

    async def _handle(
        self,
        raw: ConsumerRecord,
        group: str,
        handler: Callable[[Record[Any]], Awaitable[None]],
        idempotency_key: Callable[[Record[Any]], str] | None,
        seen: RecentKeys,
        shutdown: anyio.Event | None = None,
    ) -> bool:
        """Handle one raw record; False only when shutdown came while a transient fault was retried
        (the record is then neither handled nor dead-lettered and must stay uncommitted)."""
        try:
            record = self.decode(raw)
        except (*codec.DecodeError, UnicodeDecodeError) as e:
            await self.dead_letter(raw, f"decode: {e}", group=group)
            return True
        key = None
        delay, deadline = _RETRY_FIRST_S, time.monotonic() + self.kafka.transient_retry_s
        while True:
            try:
                key = idempotency_key(record) if idempotency_key is not None else None
                if key is not None and key in seen:
                    self.stats["duplicates"] += 1
                    return True
                await handler(record)
                break
            except (FatalError, KafkaError):
                raise
            except TRANSIENT as e:
                where = f"{raw.topic}[{raw.partition}]@{raw.offset}"
                if time.monotonic() + delay > deadline:
                    raise FatalError(
                        f"{where}: transient fault not cleared after {self.kafka.transient_retry_s:g} s "
                        f"({type(e).__name__}: {e}); stopping so the record is redelivered after a restart"
                    ) from e
                self.stats["retries"] += 1
                log.warning("%s: transient %s: %s; retrying in %.1f s", where, type(e).__name__, e, delay)
                with anyio.move_on_after(delay):
                    await (shutdown.wait() if shutdown is not None else anyio.sleep(delay))
                if shutdown is not None and shutdown.is_set():
                    return False
                delay = min(delay * 2, _RETRY_MAX_S)
            except Exception as e:
                await self.dead_letter(raw, f"handler: {type(e).__name__}: {e}", group=group)
                return True
        if key is not None:
            seen.add(key)
        self.stats["handled"] += 1
        return True

    def batch_consumer(self, topics: list[Topic[Any]], *, group: str) -> BatchConsumer:
        return BatchConsumer(self, topics, group=group)

    # --- reading without a group ---
    async def read_topic(self, topic: Topic[E], *, latest_per_key: bool | None = None) -> list[Record[E]]:
        """Every record from the beginning up to the end as of this call (see `iter_topic`).

        Compacted topics (or `latest_per_key=True`) keep only the last value per key, because Tansu
        never compacts; one key lives on one partition, so offset order is the write order per key.
        """
        compacted = TOPICS[topic].compacted if latest_per_key is None else latest_per_key
        records = [record async for record in self.iter_topic(topic)]
        if compacted:
            last: dict[str | None, Record[Any]] = {}
            for r in records:
                last.pop(r.key, None)
                last[r.key] = r
            records = list(last.values())
        return records

    def _decode_or_skip(self, raw: ConsumerRecord) -> Record[Any] | None:
        """Group-less readers log and skip undecodable records (group consumers dead-letter them)."""
        try:
            return self.decode(raw)
        except (*codec.DecodeError, UnicodeDecodeError) as e:
            log.warning("reader skips %s[%d]@%d: %s", raw.topic, raw.partition, raw.offset, e)
            return None

    async def iter_topic(self, topic: Topic[E], *, stall_timeout_s: float = 60.0) -> AsyncIterator[Record[E]]:
        """Stream every record from the beginning up to the end as of this call, then stop (no group).

        Offset order within a partition. Undecodable records are logged and skipped (a group consumer
        dead-letters them). TimeoutError if no progress is made for `stall_timeout_s`.

        The end of each partition is `true_end_offsets` as this call starts.
        """
        physical = self.names.of(topic)
        consumer = self._consumer(None)
        await consumer.start()
        try:
            tps = _assign_all(consumer, physical)
            begins, ends = await true_end_offsets(consumer, tps, timeout_s=stall_timeout_s)
            targets = {tp: ends[tp] for tp in tps if ends[tp] > begins[tp]}
            consumer.resume(*tps)
            for tp in targets:
                consumer.seek(tp, begins[tp])
            deadline = time.monotonic() + stall_timeout_s
            while targets:
                batch = await consumer.getmany(*targets, timeout_ms=500, max_records=10_000)
                if batch:
                    deadline = time.monotonic() + stall_timeout_s
                for tp, raws in batch.items():
                    for raw in raws:
                        if raw.offset >= targets.get(tp, 0):
                            break  # written after this call started
                        record = self._decode_or_skip(raw)
                        if record is not None:
                            yield record
                for tp in list(targets):
                    if await consumer.position(tp) >= targets[tp]:
                        del targets[tp]
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"iter_topic({physical}) made no progress towards the end of {sorted(targets)}"
                    )
        finally:
            with anyio.CancelScope(shield=True):
                await consumer.stop()

    async def follow_topic(
        self, topic: Topic[E], *, shutdown: anyio.Event | None = None
    ) -> AsyncIterator[Record[E]]:
        """Every record from the beginning, then new ones as they arrive, until `shutdown` is set."""
        physical = self.names.of(topic)
        wait_ms = int(self.kafka.follow_wait_s * 1000)
        consumer = AIOKafkaConsumer(**(consumer_options(self.kafka, None) | {"fetch_max_wait_ms": wait_ms}))
        await consumer.start()
        try:
            tps = _assign_all(consumer, physical)
            await consumer.seek_to_beginning(*tps)
            while shutdown is None or not shutdown.is_set():
                batch = await _fetch(consumer, shutdown, 1.0, 1000)
                for raws in batch.values():
                    for raw in raws:
                        record = self._decode_or_skip(raw)
                        if record is not None:
                            yield record
        finally:
            with anyio.CancelScope(shield=True):
                await consumer.stop()


class _SeekOnAssign(_Offsets):
    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        super().__init__(consumer)
        self.seeks: dict[TopicPartition, int] = {}

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            if tp in self.seeks:
                self.consumer.seek(tp, self.seeks.pop(tp))


class BatchConsumer:
    """Group consumer for learners: pull batches, commit explicitly after a checkpoint.

    Nothing is committed implicitly (not even on exit): the learner commits the offsets that its
    last checkpoint covers, so a restart redelivers exactly what the checkpoint lacks.
    """

    def __init__(self, bus: Bus, topics: list[str], *, group: str) -> None:
        self.bus = bus
        self.group = group
        self.topics = topics
        self._consumer = bus._consumer(group)
        self._listener = _SeekOnAssign(self._consumer)

    async def __aenter__(self) -> BatchConsumer:
        self._consumer.subscribe([self.bus.names.of(t) for t in self.topics], listener=self._listener)
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await stop_consumer(self._consumer, self.bus._producer, self.bus.kafka.request_timeout_s)

    def assignment(self) -> set[tuple[str, int]]:
        return {(self.bus.names.logical(tp.topic), tp.partition) for tp in self._consumer.assignment()}

    async def next_batch(self, max_records: int, timeout_s: float) -> list[Record[Any]]:
        """Up to max_records decoded records (possibly none after timeout_s); bad ones go to the DLQ."""
        batch = await self._consumer.getmany(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        records: list[Record[Any]] = []
        for raws in batch.values():
            for raw in raws:
                try:
                    records.append(self.bus.decode(raw))
                except (*codec.DecodeError, UnicodeDecodeError) as e:
                    await self.bus.dead_letter(raw, f"decode: {e}", group=self.group)
        return records

    def _tp(self, key: tuple[str, int]) -> TopicPartition:
        return TopicPartition(self.bus.names.of(key[0]), key[1])

    async def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        """Commit (logical topic, partition) -> next offset to read. Lost partitions are logged, not raised."""
        for key, offset in offsets.items():
            self._listener.mark(self._tp(key), offset)
        await self._listener.commit()

    async def seek(self, offsets: dict[tuple[str, int], int]) -> None:
        """Restore positions from a checkpoint: now for assigned partitions, else when first assigned."""
        assigned = self._consumer.assignment()
        for key, offset in offsets.items():
            tp = self._tp(key)
            if tp in assigned:
                self._consumer.seek(tp, offset)
            else:
                self._listener.seeks[tp] = offset
