"""The learners' group consumer: batches pulled on demand, offsets committed only for what a checkpoint covers."""

from __future__ import annotations

from typing import Any

from aiokafka import TopicPartition

from infra.bus.client import stop_consumer
from infra.bus.offsets import SeekOnAssign
from infra.bus.records import Record, redriven_elsewhere
from infra.bus.runtime import Bus
from schemas import codec


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
        self._listener = SeekOnAssign(self._consumer, probe=lambda: bus._consumer(None), lost=bus.broker_lost)

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
                if redriven_elsewhere(raw.headers, self.group):
                    continue  # redriven for the group that dead-lettered it
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
