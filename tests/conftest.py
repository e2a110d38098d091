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
from pathlib import Path
from typing import Any

import pytest

from infra.broker import Broker
from learners import tiny_preset  # noqa: F401  (registers the `tiny` preset's recipe, as the CLI does)
from schemas.config import KafkaConfig

# The presets every test that runs the CLI's roles starts from: small builds (`make test` prepares
# them first, in minutes), so that no test waits on the default presets' hour-long build.
TEST_PRESETS = Path(__file__).with_name("presets.toml")

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


async def eventually(check: Any, timeout_s: float, what: str, *, interval_s: float = 0.2) -> Any:
    """Poll `check()` (plain or async) until it returns something truthy, and return that; an
    AssertionError naming `what` after `timeout_s`."""
    import inspect
    import time

    import anyio

    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await anyio.sleep(interval_s)


def wait_for(check: Any, timeout_s: float, what: str, *, interval_s: float = 1.0) -> Any:
    """`eventually` for sync tests (subprocesses, files): poll `check()` until it returns something
    truthy, and return that; an AssertionError naming `what` after `timeout_s`."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


async def wait_records(
    bus: Any, topic: str, ok: Any, *, timeout: float = 60.0, latest_per_key: bool | None = None
) -> list[Any]:
    """Values on `topic` once `ok(values)` holds (re-read from the start until then; `latest_per_key` as
    in `read_topic`: by default only compacted topics keep one value per key); an AssertionError with
    the topic's last values after `timeout`."""
    seen: list[Any] = []

    async def values_ok() -> bool:
        seen[:] = [r.value for r in await bus.read_topic(topic, latest_per_key=latest_per_key)]
        return bool(ok(seen))

    try:
        await eventually(values_ok, timeout, f"{topic}")
    except AssertionError as e:
        raise AssertionError(f"{e}: {seen}") from None
    return seen
