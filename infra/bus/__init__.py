"""Typed bus over aiokafka: every role produces and consumes through this package.

Modules: `client` (connection options, signals, fetching, leaving a group), `records` (the typed
Record, errors, a bounded key set), `offsets` (true end offsets on Tansu and Kafka, commits),
`runtime` (the Bus: producer, decoding, the group consumer loop), `readers` (reading a topic
without a group), `batch` (the learners' batch consumer).

Consumes: any forgestream topic (logical names from `schemas.topics`). Produces: the caller's
events, `forge.metrics` (`Bus.metric`), `forge.dlq` (dead letters), `forge.strikes` and
`forge.dlq.redriven` (`Bus.redrive`).

Invariants:
- at-least-once: an offset is committed only after the handler for that record returned (and the
  handler awaits its own sends), or after its DeadLetter was acknowledged;
- one bad record never stops a consumer: a decode failure or a handler exception becomes a
  DeadLetter (raw bytes, error, source physical topic/partition/offset) and the loop goes on.
  Exceptions that mean "the process is unhealthy" propagate instead: `FatalError`, any
  `aiokafka.errors.KafkaError` (broker gone: restart and redeliver) and cancellation;
- a transient fault is not the record's fault: a handler raising `TRANSIENT` (`TransientError`, an
  OSError such as a failed read or spawn, MemoryError) or torch's OutOfMemoryError is retried with backoff, its offset
  uncommitted; if it has not cleared after `KafkaConfig.transient_retry_s` the consumer journals a
  strike on forge.strikes and stops with a FatalError (the role restarts and the record is
  redelivered); at `KafkaConfig.transient_strikes` strikes it is dead-lettered instead;
- a record redriven from the DLQ (`Bus.redrive`, `forgestream dlq redrive`) for one group is
  skipped by the others and by group-less readers: they had handled, or seen, the original;
- redelivered records whose idempotency key this process already handled are skipped (LRU window of
  `KafkaConfig.dedup_window` keys); effects that must survive restarts are deduplicated downstream;
- shutdown (the event, e.g. set by SIGTERM): stop fetching, finish the in-flight record, commit,
  leave the group;
- producers are neither idempotent nor transactional unless `KafkaConfig.idempotent_producer`
  (Tansu rejects InitProducerId from aiokafka).
"""

from infra.bus.batch import BatchConsumer
from infra.bus.client import client_options, consumer_options, install_signal_handlers, stop_consumer
from infra.bus.offsets import true_end_offsets
from infra.bus.records import (
    TRANSIENT,
    FatalError,
    RecentKeys,
    Record,
    TransientError,
    is_transient,
    redriven_elsewhere,
)
from infra.bus.runtime import Bus

__all__ = [
    "TRANSIENT",
    "BatchConsumer",
    "Bus",
    "FatalError",
    "RecentKeys",
    "Record",
    "TransientError",
    "client_options",
    "consumer_options",
    "install_signal_handlers",
    "is_transient",
    "redriven_elsewhere",
    "stop_consumer",
    "true_end_offsets",
]
