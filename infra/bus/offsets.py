"""Offsets: the true end of a partition on Tansu and Kafka, and what a group consumer has yet to commit."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
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
    """Next offsets to commit, per partition; commits what was handled before partitions move away; and
    on assignment, never starts a partition beyond its end (see `start_within_the_log`)."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        probe: Callable[[], AIOKafkaConsumer] | None = None,
        lost: Callable[[TopicPartition, int], Awaitable[None]] | None = None,
    ) -> None:
        self.consumer = consumer
        self.probe = probe  # a new group-less consumer, to read a partition's true end
        self.lost = lost  # told how many offsets the broker lost under this group's position
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
        await self.start_within_the_log(assigned)

    async def start_within_the_log(
        self, assigned: list[TopicPartition], positions: dict[TopicPartition, int] | None = None
    ) -> None:
        """A start position (the group's committed offset, or `positions`) beyond a partition's end means
        the broker lost records this group had read (a broker restarted without its newest data: the
        embedded one did, killed with its store). Its offsets then repeat, and a consumer waiting at the
        old position silently skips every record written below it (measured on Tansu: committed 10 on a
        2-record partition, records 2-9 written later were never delivered). So: say it loudly, and start
        at the end as it is now."""
        if self.probe is None or not assigned:
            return
        starts = dict(positions or {})
        for tp in assigned:
            if tp not in starts and (committed := await self.consumer.committed(tp)) is not None:
                starts[tp] = committed
        if not starts:
            return
        hints = await self.consumer.end_offsets(list(starts))  # never above the true end (Tansu: below)
        suspects = [tp for tp, start in starts.items() if start > hints[tp]]
        if not suspects:
            return
        probe = self.probe()
        await probe.start()
        try:
            _, ends = await true_end_offsets(probe, suspects)
        except (TimeoutError, KafkaError) as e:
            log.warning("could not check the end of %s after an assignment: %s", suspects, e)
            return
        finally:
            await probe.stop()
        for tp in suspects:
            if starts[tp] > ends[tp]:
                log.error(
                    "%s[%d]: this group's position %d is beyond the partition's end %d: the broker lost "
                    "records it had acknowledged; reading on from %d (records it lost are not recovered)",
                    tp.topic, tp.partition, starts[tp], ends[tp], ends[tp],
                )  # fmt: skip
                self.consumer.seek(tp, ends[tp])
                if self.lost is not None:
                    await self.lost(tp, starts[tp] - ends[tp])


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # PendingOffsets' arguments
        super().__init__(*args, **kwargs)
        self.seeks: dict[TopicPartition, int] = {}

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        restored = {tp: self.seeks.pop(tp) for tp in assigned if tp in self.seeks}
        for tp, offset in restored.items():
            self.consumer.seek(tp, offset)
        await self.start_within_the_log(assigned, restored)
