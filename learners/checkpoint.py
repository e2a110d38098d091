"""Learner checkpoints: model, optimizer, version, consumed offsets, trained keys, untrained samples.

Layout under `<workdir>/checkpoints/<model name>/`:
  step-00000012/model.safetensors      the trainable model's state (shared tensors stored once)
  step-00000012/optimizer.safetensors  per-parameter AdamW moments (see learners.engine)
  step-00000012/state.json             LearnerState: version, steps, offsets, trained keys, pending samples
  step-00000012/COMPLETE               written last; only folders holding it are ever restored
  journal.jsonl                        one line per optimizer step (keys trained) and per restore;
  journal.1.jsonl                      the segment before it (at JOURNAL_SEGMENT_BYTES the journal
                                       rotates: disk stays bounded on a run of days, the audit keeps
                                       the newest one to two segments)

Invariant: a checkpoint is written into a temporary folder and renamed into place after its files
are flushed, so a kill -9 at any moment leaves either the previous checkpoint or the new one,
never a half-written one that looks complete. No pickle anywhere.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import msgspec
import torch
from safetensors.torch import load_file, save_file

from infra.weights import retry_when_full

COMPLETE = "COMPLETE"
PREFIX = "step-"
JOURNAL_SEGMENT_BYTES = 64 << 20  # ~25,000 optimizer steps of 64 sample keys


class TrainSample(msgspec.Struct, frozen=True, kw_only=True):
    """One (prompt, response) to train on: a PolicySample or RewardSample, normalised."""

    key: str
    prompt_ids: list[int]
    response_ids: list[int]
    behaviour_logprobs: list[float]
    version: int  # weights that sampled the response
    advantage: float
    group: str = ""  # request id of the group it came from: batches and the staleness gate keep groups whole
    # response tokens before this one carry no loss (the part of an invalid answer that spelled a listed action)
    advantage_from: int = 0
    # the listed-token loss: where an invalid answer left the listed answers, the tokens that stayed on one
    unlisted_at: int = 0
    listed_tokens: list[int] = []
    listed_answers: list[list[int]] = []  # the listed-conditional term: the state's listed answers

    @property
    def group_id(self) -> str:
        """The group a batch keeps whole (a sample without one is a group of its own)."""
        return self.group or self.key


class LearnerState(msgspec.Struct, kw_only=True):
    """Everything besides tensors that a restart needs to continue exactly where it left off."""

    version: int = 0
    optimizer_step: int = 0
    # "topic:partition" -> next offset to read: every record before it is trained, dropped, or pending
    offsets: dict[str, int] = {}
    # group (request) id -> newest behaviour version of its trained samples; kept while a copy could be fresh
    trained_groups: dict[str, int] = {}
    pending: list[TrainSample] = []  # consumed (offsets include them) but not yet trained
    dropped_stale: int = 0
    duplicates: int = 0
    samples_trained: int = 0  # cumulative over restarts (status: samples_trained)
    batches: int = 0  # batches trained (a version every publish_every of them)
    # rollout groups trained or dropped as stale, cumulative (the scheduler's gate counts against it);
    # None in a checkpoint written before it was counted: unknown for good
    groups_consumed: int | None = None


def offsets_to_state(offsets: dict[tuple[str, int], int]) -> dict[str, int]:
    return {f"{topic}:{partition}": off for (topic, partition), off in offsets.items()}


def offsets_from_state(offsets: dict[str, int]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for name, off in offsets.items():
        topic, _, partition = name.rpartition(":")
        out[(topic, int(partition))] = off
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def save_checkpoint(
    root: Path,
    state: LearnerState,
    model: torch.nn.Module,
    optimizer_tensors: dict[str, torch.Tensor],
    *,
    keep_last: int = 2,
) -> Path:
    """Write a complete checkpoint for `state.optimizer_step` and prune older ones. On a full disk all
    but the newest complete checkpoint go first, then StoreFull (nothing half-written is left)."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{state.optimizer_step:08d}"

    def write() -> None:
        tmp = root / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            save_file(model_tensors(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
            save_file(optimizer_tensors, str(tmp / "optimizer.safetensors"), metadata={"format": "pt"})
            (tmp / "state.json").write_bytes(msgspec.json.encode(state))
            for name in ("model.safetensors", "optimizer.safetensors", "state.json"):
                _fsync_file(tmp / name)
            (tmp / COMPLETE).write_text("ok\n")
            _fsync_file(tmp / COMPLETE)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final.exists():  # the same step written again after a restart: replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)

    def make_room() -> None:
        remove_leftovers(root)
        for old in complete_checkpoints(root)[:-1]:
            shutil.rmtree(old, ignore_errors=True)

    retry_when_full(write, make_room, where=root, what=f"checkpoint {final.name}")
    for old in complete_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def complete_checkpoints(root: Path) -> list[Path]:
    """Restorable checkpoints, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / COMPLETE).is_file()]
    return sorted(found, key=lambda p: int(p.name.removeprefix(PREFIX)))


def remove_leftovers(root: Path) -> None:
    """Delete folders of interrupted writes (call at start-up, when this process is the only writer)."""
    if root.is_dir():
        for leftover in root.glob(".tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint (read-only: safe to call while a learner writes)."""
    found = complete_checkpoints(root)
    return found[-1] if found else None


def load_state(path: Path) -> LearnerState:
    return msgspec.json.decode((path / "state.json").read_bytes(), type=LearnerState)


def _aliases(model: torch.nn.Module) -> tuple[list[str], set[str]]:
    """State-dict names to store (first name of each tensor) and the aliases of tied weights."""
    keep, aliases, seen = [], set(), set()
    for name, value in model.state_dict(keep_vars=True).items():
        if id(value) in seen:
            aliases.add(name)
        else:
            seen.add(id(value))
            keep.append(name)
    return keep, aliases


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Own copies of the model's tensors, tied weights once. (ZeRO-1/2 turn parameters into views
    of one flat buffer, which safetensors rightly refuses to save as is.)"""
    keep, _ = _aliases(model)
    state = model.state_dict()
    return {name: state[name].detach().clone().contiguous() for name in keep}


def load_model_weights(path: Path, model: torch.nn.Module) -> None:
    result = model.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
    _, aliases = _aliases(model)
    missing = set(result.missing_keys) - aliases
    if missing or result.unexpected_keys:
        raise RuntimeError(f"checkpoint {path} does not fit the model: {missing=} {result.unexpected_keys=}")


def load_optimizer_tensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "optimizer.safetensors"))


def append_journal(root: Path, entry: dict) -> None:
    """Append-only record of what each optimizer step trained (tests and audits read it); a full
    segment becomes journal.1.jsonl, replacing the one before."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "journal.jsonl"
    torn = False
    if path.is_file() and path.stat().st_size >= JOURNAL_SEGMENT_BYTES:
        os.replace(path, root / "journal.1.jsonl")
    if path.is_file() and path.stat().st_size > 0:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
    with open(path, "a") as f:
        f.write(("\n" if torn else "") + json.dumps(entry) + "\n")
        f.flush()


def read_lineage(root: Path) -> list[dict]:
    """The steps the newest weights descend from: steps undone by a restore are cut out."""
    lineage: list[dict] = []
    lines = [
        line
        for path in (root / "journal.1.jsonl", root / "journal.jsonl")
        if path.is_file()
        for line in path.read_text().splitlines()
    ]
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:  # a line torn by kill -9, or blank
            continue
        if "restored_step" in entry:
            lineage = [e for e in lineage if e["step"] <= entry["restored_step"]]
        else:
            lineage.append(entry)
    return lineage
