"""Which bus a one-off command (status, report, replay) talks to.

`--bootstrap` names a running broker. `--workdir` names a run folder: if a broker of that run is
still up (its address is in `<workdir>/broker.json`) we use it; otherwise, for a durable run, we start
the broker on the run's stored data for the duration of the command, so a stopped system can be
inspected too.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec

from schemas.config import KafkaConfig

if TYPE_CHECKING:
    from infra.progress import Progress

BROKER_FILE = "broker.json"


def record_broker(workdir: Path, bootstrap: str, durable: bool) -> None:
    (workdir / BROKER_FILE).write_text(json.dumps({"bootstrap": bootstrap, "durable": durable}))


@contextlib.asynccontextmanager
async def kafka_for(
    kafka: KafkaConfig, *, bootstrap: str | None, workdir: Path | None
) -> AsyncIterator[KafkaConfig]:
    from infra.broker import Broker, BrokerError, wait_reachable

    if bootstrap is not None or workdir is None:
        yield kafka if bootstrap is None else msgspec.structs.replace(kafka, bootstrap=bootstrap)
        return
    info_path = workdir / BROKER_FILE
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    if info.get("bootstrap"):
        try:
            wait_reachable(info["bootstrap"], timeout_s=1.0)
            yield msgspec.structs.replace(kafka, bootstrap=info["bootstrap"])
            return
        except BrokerError:
            pass  # that run has stopped
    if not info.get("durable") or not (workdir / "broker").is_dir():
        raise BrokerError(
            f"no broker for {workdir}: the run is not running and kept no durable data "
            "(ephemeral runs leave only <workdir>/report/summary.json)"
        )
    broker = Broker(durable=True, data_dir=workdir / "broker")
    await anyio.to_thread.run_sync(broker.start)
    try:
        yield msgspec.structs.replace(kafka, bootstrap=broker.bootstrap)
    finally:
        await anyio.to_thread.run_sync(broker.stop)


async def read_progress(kafka: KafkaConfig) -> Progress:  # noqa: F821
    """Fold every record of the progress topics, in timestamp order, into a Progress."""
    from infra.bus import Bus
    from infra.progress import PROGRESS_TOPICS, Progress

    progress = Progress()
    async with Bus(kafka, role="status") as bus:
        records = []
        for topic in PROGRESS_TOPICS:
            records.extend(await bus.read_topic(topic, latest_per_key=False))
    for r in sorted(records, key=lambda r: r.timestamp_ms):
        progress.apply(r.topic, r.value, r.timestamp_ms / 1000.0)
    return progress
