"""Shared fixtures: one real Tansu broker per test session, a fresh topic prefix per test.

Set FORGESTREAM_TEST_BOOTSTRAP=host:port to run the suite against an existing broker (e.g. Kafka)
instead of starting Tansu.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from infra.broker import Broker
from schemas.config import KafkaConfig

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass(frozen=True)
class ExternalBroker:
    bootstrap: str


def run_sync(coro: Any) -> Any:
    """Run a coroutine to completion from sync code, even inside a running event loop (own thread)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coro)
        except BaseException as e:  # re-raised in the caller
            result["error"] = e

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker | ExternalBroker]:
    """A Tansu broker on a free port for the whole session (`.bootstrap` is host:port)."""
    external = os.environ.get("FORGESTREAM_TEST_BOOTSTRAP")
    if external:
        yield ExternalBroker(external)
        return
    with Broker() as b:
        yield b


@pytest.fixture
def kafka_config(broker: Broker | ExternalBroker) -> KafkaConfig:
    """KafkaConfig with a fresh topic prefix; every forgestream topic already created under it."""
    from infra.topics import create_topics

    config = KafkaConfig(
        bootstrap=broker.bootstrap,
        topic_prefix=f"t{uuid.uuid4().hex[:10]}.",
        session_timeout_s=6.0,
        heartbeat_interval_s=0.5,
        request_timeout_s=15.0,
    )
    run_sync(create_topics(config))
    return config


async def wait_records(bus: Any, topic: str, ok: Any, *, timeout: float = 60.0) -> list[Any]:
    """Values on `topic` once `ok(values)` holds (re-read from the start until then)."""
    import anyio

    with anyio.fail_after(timeout):
        while True:
            values = [r.value for r in await bus.read_topic(topic)]
            if ok(values):
                return values
            await anyio.sleep(0.2)
