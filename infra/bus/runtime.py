"""The Bus: one per process; a typed producer (events, metrics, dead letters), decoding, and the group
consumer loop with the guarantees in the package docstring."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio
import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord

from infra.bus.client import client_options, consumer_options, fetch_or_shutdown, stop_consumer
from infra.bus.offsets import PendingOffsets
from infra.bus.readers import TopicReaders
from infra.bus.records import E, FatalError, RecentKeys, Record, is_transient, redriven_elsewhere
from schemas import codec
from schemas.config import KafkaConfig
from schemas.events import DeadLetter, Metric, Redriven, Strike, finite
from schemas.topics import (
    DLQ,
    METRICS,
    REDRIVE_GROUP_HEADER,
    REDRIVE_HEADER,
    REDRIVEN,
    STRIKES,
    TOPICS,
    Topic,
    TopicNames,
)

log = logging.getLogger("forgestream.bus")
_DLQ_HEADROOM = 64 << 10  # bytes kept free in a dead letter for its metadata
_RETRY_FIRST_S, _RETRY_MAX_S = 0.5, 30.0


class Bus(TopicReaders):
    """One per process: a typed producer plus factories for typed consumers."""

    def __init__(self, kafka: KafkaConfig, *, role: str) -> None:
        self.kafka = kafka
        self.role = role
        self.names = TopicNames(kafka.topic_prefix)
        self.stats = dict.fromkeys(
            ("sent", "handled", "duplicates", "dead_letters", "retries", "not_ours", "offsets_lost"), 0
        )
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

    async def broker_lost(self, tp: TopicPartition, offsets: int) -> None:
        """A group's position was `offsets` beyond a partition's end: the broker lost records it had
        acknowledged (the consumer reads on from the end). Counted, and metric `bus/offsets_lost`, so
        a run's report and TensorBoard show it, not only the role's log."""
        self.stats["offsets_lost"] += offsets
        topic = self.names.logical(tp.topic)
        await self.metric("bus/offsets_lost", offsets, topic=topic, partition=str(tp.partition))

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

    async def redrive(self, letter: Record[DeadLetter]) -> Redriven:
        """Send a dead letter's record back to its source topic and partition, unchanged, for the group
        that dead-lettered it (other groups and readers skip it), then journal it on forge.dlq.redriven.

        The copy is acked before the journal entry is sent: a crash between the two redrives it again
        next time (at-least-once; the group's idempotency keys absorb the copy)."""
        dead = letter.value
        self.names.logical(dead.source_topic)  # KeyError: not a topic of this run
        coordinates = f"{letter.partition}@{letter.offset}"
        headers = [(REDRIVE_HEADER, coordinates.encode())]
        if dead.group:
            headers.append((REDRIVE_GROUP_HEADER, dead.group.encode()))
        ack = await self.producer.send(
            dead.source_topic, value=dead.value, key=dead.key, partition=dead.partition, headers=headers
        )
        landed = await ack
        journal = Redriven(
            dlq_partition=letter.partition,
            dlq_offset=letter.offset,
            source_topic=dead.source_topic,
            to_offset=landed.offset,
            group=dead.group,
        )
        await self.send(REDRIVEN, journal, key=coordinates)
        return journal

    async def _strike(self, raw: ConsumerRecord, group: str, fault: BaseException) -> bool:
        """A transient fault outlasted `transient_retry_s`: the record's next strike. Below the limit it
        is journaled and the consumer stops (FatalError: the role restarts and gets the record again);
        at the limit the record is dead-lettered and the consumer goes on (True)."""
        retry_s, limit = self.kafka.transient_retry_s, self.kafka.transient_strikes
        where = f"{raw.topic}[{raw.partition}]@{raw.offset}"
        key = f"{group}/{raw.topic}/{raw.partition}/{raw.offset}"
        strike = 1 + sum(r.key == key for r in await self.read_topic(STRIKES)) if limit else 0
        fault_text = f"{type(fault).__name__}: {fault}"
        if limit and strike >= limit:
            await self.dead_letter(
                raw,
                f"transient fault not cleared in {strike} rounds of {retry_s:g} s ({fault_text})",
                group=group,
            )
            return True
        if limit:
            event = Strike(
                source_topic=raw.topic,
                partition=raw.partition,
                offset=raw.offset,
                group=group,
                error=fault_text[:10_000],
            )
            await self.send(STRIKES, event, key=key)
        budget = f"strike {strike} of {limit}" if limit else "no strike limit"
        raise FatalError(
            f"{where}: transient fault not cleared after {retry_s:g} s ({fault_text}); stopping so the "
            f"record is redelivered after a restart ({budget})"
        ) from fault

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
        offsets = PendingOffsets(consumer, probe=lambda: self._consumer(None), lost=self.broker_lost)
        seen = RecentKeys(self.kafka.dedup_window if idempotency_key is not None else 0)
        consumer.subscribe([self.names.of(t) for t in topics], listener=offsets)
        await consumer.start()
        try:
            while shutdown is None or not shutdown.is_set():
                batch = await fetch_or_shutdown(consumer, shutdown, 1.0, max_records)
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
        if redriven_elsewhere(raw.headers, group):
            self.stats["not_ours"] += 1  # redriven for the group that dead-lettered it
            return True
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
            except Exception as e:
                if not is_transient(e):
                    await self.dead_letter(raw, f"handler: {type(e).__name__}: {e}", group=group)
                    return True
                where = f"{raw.topic}[{raw.partition}]@{raw.offset}"
                if time.monotonic() + delay > deadline:
                    return await self._strike(raw, group, e)
                self.stats["retries"] += 1
                log.warning("%s: transient %s: %s; retrying in %.1f s", where, type(e).__name__, e, delay)
                with anyio.move_on_after(delay):
                    await (shutdown.wait() if shutdown is not None else anyio.sleep(delay))
                if shutdown is not None and shutdown.is_set():
                    return False
                delay = min(delay * 2, _RETRY_MAX_S)
        if key is not None:
            seen.add(key)
        self.stats["handled"] += 1
        return True
