"""archive: an optional sink of judged trajectories as JSON lines in the workdir, for reports.

Consumes `forge.trajectories.judged` (group "archive"). Produces files, no events:
`<workdir>/archive/judged-YYYY-MM-DD.jsonl` (UTC day of the record timestamp), one JudgedTrajectory
per line as msgspec JSON, with `_partition` and `_offset` of the record.
Invariant: a line is flushed to the file before the record's offset is committed (at-least-once); a
restart may append a line twice, so readers keep the last line per trajectory key
(`trajectory.request_id` / `trajectory.rollout_index`) — `read_archive` does.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import anyio
import msgspec

from infra.bus import Bus, Record
from schemas.config import RunConfig
from schemas.events import JudgedTrajectory
from schemas.topics import JUDGED

GROUP = "archive"
_encoder = msgspec.json.Encoder()


class Archive:
    """Appends judged trajectories to one file per UTC day."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self._day = ""
        self._file: IO[bytes] | None = None

    def path(self, day: str) -> Path:
        return self.folder / f"judged-{day}.jsonl"

    def write(self, record: Record[JudgedTrajectory]) -> None:
        day = dt.datetime.fromtimestamp(record.timestamp_ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d")
        if day != self._day or self._file is None:
            self.close()
            self._file = self.path(day).open("ab")
            self._day = day
        line = _encoder.encode(record.value)
        self._file.write(line[:-1] + b',"_partition":%d,"_offset":%d}\n' % (record.partition, record.offset))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_archive(folder: Path) -> Iterator[dict[str, Any]]:
    """Every archived trajectory once (last line per trajectory key), oldest file first."""
    latest: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("judged-*.jsonl")):
        for line in path.read_bytes().splitlines():
            if line.strip():
                item = msgspec.json.decode(line)
                t = item["trajectory"]
                latest.pop(f"{t['request_id']}/{t['rollout_index']}", None)
                latest[f"{t['request_id']}/{t['rollout_index']}"] = item
    yield from latest.values()


async def run(config: RunConfig, *, shutdown: anyio.Event | None = None) -> None:
    """Archive judged trajectories until `shutdown` is set."""
    archive = Archive(Path(config.workdir) / "archive")

    async def handle(record: Record[JudgedTrajectory]) -> None:
        archive.write(record)

    try:
        async with Bus(config.kafka, role="archive") as bus:
            await bus.consume(
                [JUDGED],
                group=GROUP,
                handler=handle,
                idempotency_key=lambda r: r.value.key,
                shutdown=shutdown,
            )
    finally:
        archive.close()
