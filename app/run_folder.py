"""Which bus a one-off command (status, report, replay) talks to.

`--bootstrap` names a running broker. `--workdir` names a run folder: if a broker of that run is
still up (its address is in `<workdir>/broker.json`) we use it; otherwise, for a durable run, we start
the broker on the run's stored data for the duration of the command, so a stopped system can be
inspected too. One `up` holds a run folder at a time (`hold_workdir`): a second `up` on it fails at
once, and a one-off command never starts a broker on the data of a live run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec

from schemas.config import KafkaConfig

if TYPE_CHECKING:
    from app.progress import Progress

BROKER_FILE = "broker.json"
LOCK_FILE = "up.lock"


class WorkdirInUse(RuntimeError):
    """Another `forgestream up` holds this run folder."""


@contextlib.contextmanager
def hold_workdir(workdir: Path) -> Iterator[None]:
    """Exclusive hold of a run folder for one `up`: an flock on <workdir>/up.lock, which the kernel
    releases when the holder dies, kill -9 included (no stale lock to clean up)."""
    workdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(workdir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise WorkdirInUse(
            f"{workdir} is in use by another forgestream process (pid {holder}: an `up`, or a command "
            "reading a stopped run's data): two brokers or runs on one folder would share its data; "
            "stop that one or choose another --workdir"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def workdir_held(workdir: Path) -> bool:
    """Whether a live `up` holds the run folder (probed with a shared, non-blocking flock)."""
    path = workdir / LOCK_FILE
    if not path.is_file():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


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
    live = (
        f"the process that holds {workdir} is live but its broker "
        f"({info.get('bootstrap') or 'address not yet recorded'}) does not answer; try again shortly "
        "(a second broker on a run's data is never started)"
    )
    if workdir_held(workdir):
        raise BrokerError(live)
    if not info.get("durable") or not (workdir / "broker").is_dir():
        raise BrokerError(
            f"no broker for {workdir}: the run is not running and kept no durable data "
            "(ephemeral runs leave only <workdir>/report/summary.json)"
        )
    with contextlib.ExitStack() as held:
        try:  # held while our broker runs on the stopped run's data: no `up` starts another on it
            held.enter_context(hold_workdir(workdir))
        except WorkdirInUse:
            raise BrokerError(live) from None
        broker = Broker(durable=True, data_dir=workdir / "broker")
        await anyio.to_thread.run_sync(broker.start)
        try:
            yield msgspec.structs.replace(kafka, bootstrap=broker.bootstrap)
        finally:
            await anyio.to_thread.run_sync(broker.stop)


async def read_progress(kafka: KafkaConfig) -> Progress:  # noqa: F821
    """Fold every record of the progress topics, in timestamp order, into a Progress."""
    from app.progress import PROGRESS_TOPICS, Progress
    from infra.bus import Bus

    progress = Progress()
    async with Bus(kafka, role="status") as bus:
        records = []
        for topic in PROGRESS_TOPICS:
            records.extend(await bus.read_topic(topic, latest_per_key=False))
    for r in sorted(records, key=lambda r: r.timestamp_ms):
        progress.apply(r.topic, r.value, r.timestamp_ms / 1000.0)
    return progress
