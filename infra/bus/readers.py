"""Reading a topic without a group: everything up to now (`iter_topic`, `read_topic`) or everything and
then what arrives (`follow_topic`). Undecodable records are logged and skipped (a group consumer
dead-letters them)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition

from infra.bus.client import consumer_options, fetch_or_shutdown
from infra.bus.offsets import assign_all, true_end_offsets
from infra.bus.records import E, Record, redriven_elsewhere
from schemas import codec
from schemas.config import KafkaConfig
from schemas.topics import TOPICS, Topic, TopicNames

log = logging.getLogger("forgestream.bus")


class TopicReaders:
    """The Bus's group-less readers (a mixin: needs the Bus's `kafka`, `names`, `decode`, `_consumer`)."""

    kafka: KafkaConfig
    names: TopicNames
    decode: Callable[[ConsumerRecord], Record[Any]]
    _consumer: Callable[[str | None], AIOKafkaConsumer]

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
        """Group-less readers log and skip undecodable records (group consumers dead-letter them), and
        skip a record redriven for one group: they had seen the original."""
        if redriven_elsewhere(raw.headers, None):
            return None
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
            tps = assign_all(consumer, physical)
            begins, ends = await true_end_offsets(consumer, tps, timeout_s=stall_timeout_s)
            async for record in self._read_up_to(consumer, begins, ends, stall_timeout_s):
                yield record
        finally:
            with anyio.CancelScope(shield=True):
                await consumer.stop()

    async def _read_up_to(
        self,
        consumer: AIOKafkaConsumer,
        starts: dict[TopicPartition, int],
        ends: dict[TopicPartition, int],
        stall_timeout_s: float,
    ) -> AsyncIterator[Record[Any]]:
        """Each partition's records from `starts` up to (not including) `ends`, then stop.

        TimeoutError if no progress is made for `stall_timeout_s`."""
        targets = {tp: ends[tp] for tp in starts if ends[tp] > starts[tp]}
        consumer.resume(*starts)
        for tp in targets:
            consumer.seek(tp, starts[tp])
        deadline = time.monotonic() + stall_timeout_s
        while targets:
            batch = await consumer.getmany(*targets, timeout_ms=500, max_records=10_000)
            if batch:
                deadline = time.monotonic() + stall_timeout_s
            for tp, raws in batch.items():
                for raw in raws:
                    if raw.offset >= targets.get(tp, 0):
                        break  # written after the end was taken
                    record = self._decode_or_skip(raw)
                    if record is not None:
                        yield record
            for tp in list(targets):
                if await consumer.position(tp) >= targets[tp]:
                    del targets[tp]
            if time.monotonic() > deadline:
                raise TimeoutError(f"made no progress towards the end of {sorted(targets)}")

    async def follow_topic(
        self, topic: Topic[E], *, shutdown: anyio.Event | None = None, drain_s: float = 0.0
    ) -> AsyncIterator[Record[E]]:
        """Every record from the beginning, then new ones as they arrive, until `shutdown` is set.

        With `drain_s` > 0 it then reads on to the end of the topic as of the stop (giving up after
        `drain_s` without progress), so a caller that folds the topic misses nothing written before it.
        """
        physical = self.names.of(topic)
        wait_ms = int(self.kafka.follow_wait_s * 1000)
        consumer = AIOKafkaConsumer(**(consumer_options(self.kafka, None) | {"fetch_max_wait_ms": wait_ms}))
        await consumer.start()
        try:
            tps = assign_all(consumer, physical)
            await consumer.seek_to_beginning(*tps)
            while shutdown is None or not shutdown.is_set():
                batch = await fetch_or_shutdown(consumer, shutdown, 1.0, 1000)
                for raws in batch.values():
                    for raw in raws:
                        record = self._decode_or_skip(raw)
                        if record is not None:
                            yield record
            if drain_s > 0:
                at = {tp: await consumer.position(tp) for tp in tps}
                try:
                    _, ends = await true_end_offsets(consumer, tps, timeout_s=drain_s)
                    async for record in self._read_up_to(consumer, at, ends, drain_s):
                        yield record
                except (TimeoutError, KafkaError) as e:  # the broker is gone: fold what was read
                    log.warning("follow_topic(%s) stops short of the end: %s", physical, e)
        finally:
            with anyio.CancelScope(shield=True):
                await consumer.stop()
