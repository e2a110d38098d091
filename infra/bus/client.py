"""Kafka client plumbing: connection and consumer options, signal handling, a fetch that a shutdown
interrupts, and leaving a group (with Tansu's generation-0 workaround)."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any

import anyio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord

from schemas.config import KafkaConfig

log = logging.getLogger("forgestream.bus")


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


async def fetch_or_shutdown(
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
