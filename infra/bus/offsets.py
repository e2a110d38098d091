"""Offsets: the true end of a partition on Tansu and Kafka, and what a group consumer has yet to commit."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError
from aiokafka.structs import OffsetAndMetadata

log = logging.getLogger("forgestream.bus")


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


class PendingOffsets(ConsumerRebalanceListener):
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


def assign_all(consumer: AIOKafkaConsumer, physical: str) -> list[TopicPartition]:
    """Assign every partition of `physical` (no group); KeyError if the topic does not exist."""
    partitions = sorted(consumer.partitions_for_topic(physical) or ())
    if not partitions:
        raise KeyError(f"topic {physical!r} does not exist (create topics first)")
    tps = [TopicPartition(physical, p) for p in partitions]
    consumer.assign(tps)
    return tps


class SeekOnAssign(PendingOffsets):
    """PendingOffsets that also restores checkpointed positions when a partition is first assigned."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        super().__init__(consumer)
        self.seeks: dict[TopicPartition, int] = {}

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            if tp in self.seeks:
                self.consumer.seek(tp, self.seeks.pop(tp))
