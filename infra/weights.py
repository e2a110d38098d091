"""Weight store and watcher: how new weights reach actors and judges without going through Kafka.

Produces: one folder per version, `<url>/<model>/v000007/` (model.safetensors, config.json,
tokenizer files), and the `WeightsPublished` event describing it (the learner sends that event
on forge.weights). Consumes (WeightsWatcher): forge.weights from the beginning, keeping the newest
event per model (Tansu's `latest` offset is wrong, and the topic is compacted on real Kafka).
Invariant: a folder is visible under its final name only when complete (written under a temporary
name, then renamed); nothing is loaded unless it comes from this store's own folder for the event's
(model, version), whatever uri the event names, and its model.safetensors is a well-formed safetensors
file whose sha256, taken over the very bytes that are loaded, equals the event's; pickle checkpoints
are never read. Every saved version loads with
plain `AutoModelForCausalLM.from_pretrained`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
import fsspec
from fsspec.implementations.local import LocalFileSystem

from schemas.config import RunConfig
from schemas.events import WeightsPublished
from schemas.topics import WEIGHTS

if TYPE_CHECKING:
    from infra.bus import Bus

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
T = TypeVar("T")
LEFTOVER_AGE_S = 600.0  # a staging folder this old belongs to a killed writer, not a slow one
# Files a folder must never hold: formats that run code when loaded.
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
_MAX_HEADER = 100 << 20
_SAFETENSORS_DTYPES = {
    "BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64",
    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64",
}  # fmt: skip


class StoreFull(OSError):
    """A store stayed full after pruning what it could: nothing was written (no half-written folder)."""


def retry_when_full(
    write: Callable[[], T], make_room: Callable[[], None], *, where: str | Path, what: str
) -> T:
    """`write()`; on a full disk (ENOSPC) `make_room()` and write once more; still full: StoreFull, naming
    the place and the free bytes. `write` must leave nothing behind when it fails."""
    try:
        return write()
    except Exception as e:
        if not _disk_full(e):
            raise
        log.warning("%s: %s is full; pruning and retrying", what, where)
    make_room()
    try:
        return write()
    except Exception as e:
        if not _disk_full(e):
            raise
        free = shutil.disk_usage(where).free if Path(where).exists() else 0
        raise StoreFull(errno.ENOSPC, f"{what}: no space left in {where} ({free} bytes free after pruning); "
                        "free some space or point the store elsewhere") from e  # fmt: skip


def _disk_full(e: BaseException) -> bool:
    """ENOSPC, also when a library wraps it (safetensors raises its own error naming os error 28)."""
    return (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e)


class WeightsRejected(Exception):
    """A weights folder that must not be loaded (hash mismatch, not safetensors, wrong shapes)."""


def version_dir(version: int) -> str:
    return f"v{version:06d}"


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_safetensors(path: Path) -> None:
    """Raise WeightsRejected unless `path` is a well-formed safetensors file (header checked, no data read)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise WeightsRejected(f"{path}: not a safetensors file (only {size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n < 2 or n > min(_MAX_HEADER, size - 8):
                raise WeightsRejected(f"{path}: not a safetensors file (header length {n} for {size} bytes)")
            header = json.loads(f.read(n))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise WeightsRejected(f"{path}: not a safetensors file ({e})") from e
    if not isinstance(header, dict):
        raise WeightsRejected(f"{path}: not a safetensors file (header is not a JSON object)")
    data_len = size - 8 - n
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        ok = (
            isinstance(meta, dict)
            and meta.get("dtype") in _SAFETENSORS_DTYPES
            and isinstance(meta.get("data_offsets"), list)
            and len(meta["data_offsets"]) == 2
            and 0 <= meta["data_offsets"][0] <= meta["data_offsets"][1] <= data_len
        )
        if not ok:
            raise WeightsRejected(f"{path}: not a safetensors file (bad entry for tensor {name!r})")


def check_folder(folder: Path) -> Path:
    """The folder's model.safetensors after checking the folder holds safetensors weights only."""
    if not folder.is_dir():
        raise WeightsRejected(f"{folder}: no such weights folder")
    pickles = sorted(p.name for p in folder.iterdir() if p.name.endswith(_PICKLE_SUFFIXES))
    if pickles:
        raise WeightsRejected(
            f"{folder}: refusing a folder with pickle checkpoints {pickles}; safetensors only"
        )
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise WeightsRejected(f"{folder}: no {WEIGHTS_FILE} (only safetensors weights are accepted)")
    check_safetensors(weights)
    return weights


def read_safetensors_checked(folder: Path) -> dict[str, Any]:
    """Tensors of `folder`/model.safetensors, after the safetensors checks."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights = check_folder(folder)
    try:
        return load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as e:
        raise WeightsRejected(f"{weights}: unreadable safetensors ({e})") from e


class WeightStore:
    """Versioned weights in a directory or any fsspec URL (s3://…, memory://…)."""

    @classmethod
    def for_run(cls, config: RunConfig) -> WeightStore:
        """The run's store: `store.weights_url`, or `<workdir>/weights` when that is empty."""
        url = config.store.weights_url or str(Path(config.workdir) / "weights")
        return cls(url, keep_last=config.store.keep_last)

    def __init__(self, url: str, *, keep_last: int = 5, cache_dir: str | Path | None = None):
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1")
        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.root = self.root.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)
        self.keep_last = keep_last
        self._cache = Path(cache_dir) if cache_dir else Path(tempfile.gettempdir()) / "forgestream-weights"
        if self.local:
            Path(self.root).mkdir(parents=True, exist_ok=True)

    def uri(self, model_name: str, version: int) -> str:
        path = f"{self.root}/{model_name}/{version_dir(version)}"
        return path if self.local else self.fs.unstrip_protocol(path)

    # --- writing ---
    def publish(
        self,
        model_name: Literal["policy", "reward"],
        version: int,
        model: Any,
        tokenizer: Any,
        *,
        preset: str = "",
        optimizer_step: int = 0,
        groups_consumed: int | None = None,
    ) -> WeightsPublished:
        """Write `model` (+ tokenizer) as version `version`; return the event to send on forge.weights.
        On a full disk the older versions go first (all but the newest), then StoreFull."""
        parent = f"{self.root}/{model_name}"
        digest, size = retry_when_full(
            lambda: self._write(model_name, version, model, tokenizer),
            lambda: self.prune(model_name, keep_last=1),
            where=Path(parent if self.local else self._cache),
            what=f"publishing {model_name} v{version}",
        )
        self.prune(model_name)
        return WeightsPublished(
            model=model_name,
            version=version,
            uri=self.uri(model_name, version),
            sha256=digest,
            bytes=size,
            preset=preset,
            optimizer_step=optimizer_step,
            groups_consumed=groups_consumed,
        )

    def _write(self, model_name: str, version: int, model: Any, tokenizer: Any) -> tuple[str, int]:
        """Stage, verify and move one version into place; (sha256, bytes). Leaves nothing on failure."""
        parent = f"{self.root}/{model_name}"
        final = f"{parent}/{version_dir(version)}"
        staging = (
            Path(parent if self.local else self._cache) / f".tmp-{version_dir(version)}-{uuid.uuid4().hex}"
        )
        staging.mkdir(parents=True)
        try:
            # one file, so the event's sha256 covers every weight
            model.save_pretrained(str(staging), max_shard_size="1000GB")
            if tokenizer is not None:
                tokenizer.save_pretrained(str(staging))
            weights = staging / WEIGHTS_FILE
            check_safetensors(weights)
            digest, size = sha256_file(weights), weights.stat().st_size
            if self.local:
                self._replace_local(staging, Path(final))
            else:
                tmp_remote = f"{parent}/.tmp-{uuid.uuid4().hex}"
                self.fs.put(str(staging), tmp_remote, recursive=True)
                if self.fs.exists(final):
                    self.fs.rm(final, recursive=True)
                self.fs.mv(tmp_remote, final, recursive=True)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        return digest, size

    @staticmethod
    def _replace_local(staging: Path, final: Path) -> None:
        if final.exists():  # a re-published version (learner restarted from an older checkpoint)
            trash = final.with_name(f".old-{final.name}-{uuid.uuid4().hex}")
            os.replace(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(staging, final)

    def versions(self, model_name: str) -> list[int]:
        parent = f"{self.root}/{model_name}"
        if not self.fs.exists(parent):
            return []
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(parent, detail=False)]
        return sorted(int(n[1:]) for n in names if n.startswith("v") and n[1:].isdigit())

    def prune(self, model_name: str, *, keep_last: int | None = None) -> None:
        """Delete all but the newest keep_last versions of `model_name` (the store's, unless given), and
        the leftovers of writes a kill interrupted (staging `.tmp-*`, replaced `.old-*`) once older than
        LEFTOVER_AGE_S."""
        for v in self.versions(model_name)[: -(keep_last or self.keep_last)]:
            path = f"{self.root}/{model_name}/{version_dir(v)}"
            try:
                self.fs.rm(path, recursive=True)
            except FileNotFoundError:
                pass
        staging_parent = Path(f"{self.root}/{model_name}") if self.local else self._cache
        if staging_parent.is_dir():
            cutoff = time.time() - LEFTOVER_AGE_S
            for leftover in [*staging_parent.glob(".tmp-*"), *staging_parent.glob(".old-*")]:
                try:
                    if leftover.stat().st_mtime < cutoff:
                        shutil.rmtree(leftover, ignore_errors=True)
                except FileNotFoundError:
                    pass

    # --- reading ---
    def fetch(self, event: WeightsPublished) -> Path:
        """A private local snapshot of the event's weights, verified; WeightsRejected otherwise.

        Only this store's own folder for (model, version) is read, whatever `uri` the event names: the
        sha256 travels in the same event, so it proves integrity, not origin. The weights file is read
        once, hashed as it is copied into the snapshot, and the snapshot is what gets loaded (a file
        swapped after the check is never loaded). Snapshots beyond keep_last per model are pruned."""
        what = f"{event.model} v{event.version} at {event.uri}"
        expected = self.uri(event.model, event.version)
        if not self._same_place(event.uri, expected):
            raise WeightsRejected(
                f"{what}: not this run's weight store (expected {expected}); refusing to load it"
            )
        source = f"{self.root}/{event.model}/{version_dir(event.version)}"
        snapshots = self._cache / "snapshots" / event.model
        snapshot = (
            snapshots
            / f"{version_dir(event.version)}-{event.sha256[:16]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        tmp = snapshot.with_name(".tmp-" + snapshot.name)
        tmp.mkdir(parents=True)
        try:
            try:
                listing = self.fs.ls(source, detail=True)
                names = [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in listing if e["type"] == "file"]
            except FileNotFoundError as e:
                raise WeightsRejected(f"{what}: not in the store ({e})") from e
            digest = hashlib.sha256()
            for name in names:
                with self.fs.open(f"{source}/{name}", "rb") as src, open(tmp / name, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                        if name == WEIGHTS_FILE:
                            digest.update(chunk)
            try:
                check_folder(tmp)  # safetensors only, no pickle beside it (nothing here is loaded yet)
            except WeightsRejected as e:
                raise WeightsRejected(f"{what}: {e}; refusing to load it") from e
            if digest.hexdigest() != event.sha256:
                raise WeightsRejected(
                    f"{what}: sha256 mismatch (event says {event.sha256[:16]}…, file has {digest.hexdigest()[:16]}…); "
                    "refusing to load it"
                )
            os.replace(tmp, snapshot)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._prune_snapshots(snapshots)
        return snapshot

    def _same_place(self, uri: str, expected: str) -> bool:
        if not self.local:
            return uri.rstrip("/") == expected.rstrip("/")
        fs, path = fsspec.core.url_to_fs(uri)
        return isinstance(fs, LocalFileSystem) and os.path.realpath(path) == os.path.realpath(expected)

    def _prune_snapshots(self, folder: Path) -> None:
        """Keep this process's newest keep_last snapshots of one model; drop those of dead processes."""
        mine = []
        for p in folder.iterdir():
            parts = p.name.split("-")  # v000007-<sha16>-<pid>-<nonce>
            if len(parts) != 4 or not parts[2].isdigit():
                continue
            if int(parts[2]) == os.getpid():
                mine.append(p)
            elif not _alive(int(parts[2])):
                shutil.rmtree(p, ignore_errors=True)
        for old in sorted(mine, key=lambda p: p.stat().st_mtime)[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WeightsWatcher:
    """Follows forge.weights from the beginning and remembers the newest event for one model."""

    def __init__(self, bus: Bus, store: WeightStore, model_name: str):
        self.bus, self.store, self.model_name = bus, store, model_name
        self.newest: WeightsPublished | None = None
        self._changed = anyio.Event()
        self._rejected: set[tuple[int, str]] = set()
        self.refused = 0  # versions refused (wrong place, hash, format or shapes)

    async def run(self, shutdown: anyio.Event | None = None) -> None:
        async for record in self.bus.follow_topic(WEIGHTS, shutdown=shutdown):
            self.observe(record.value)

    def observe(self, event: WeightsPublished) -> None:
        if event.model != self.model_name:
            return
        if self.newest is None or event.version >= self.newest.version:
            self.newest = event
            self._changed.set()
            self._changed = anyio.Event()

    def newer_than(self, version: int) -> WeightsPublished | None:
        """The newest event if it is newer than `version` and not already refused, else None."""
        ev = self.newest
        if ev is None or ev.version <= version or (ev.version, ev.sha256) in self._rejected:
            return None
        return ev

    async def wait_newer_than(self, version: int) -> WeightsPublished:
        while (ev := self.newer_than(version)) is None:
            await self._changed.wait()
        return ev

    def apply(self, backend: Any) -> int | None:
        """Blocking: load the newest version into `backend` if it is newer; returns the version loaded.

        A refused version is logged and remembered (not retried); the backend keeps its weights.
        Call it between episodes, in a worker thread (`anyio.to_thread.run_sync`).
        """
        ev = self.newer_than(backend.version)
        if ev is None:
            return None
        started = time.perf_counter()
        try:
            backend.load_weights(ev.version, self.store.fetch(ev))
        except WeightsRejected as e:
            self._rejected.add((ev.version, ev.sha256))
            self.refused += 1
            log.error("weights refused, keeping version %s: %s", backend.version, e)
            return None
        log.info("loaded %s v%s in %.3fs", ev.model, ev.version, time.perf_counter() - started)
        return ev.version
