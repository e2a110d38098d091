"""Weight store and watcher: atomic safetensors versions, sha256 checks, refusal keeps the old weights."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import msgspec
import pytest
import torch
from transformers import AutoModelForCausalLM

from infra.models import load_trainable, prepare_preset
from infra.models.hf_backend import HFBackend
from infra.weights import WeightsRejected, WeightStore, WeightsWatcher, sha256_file
from schemas.config import ModelConfig
from schemas.events import WeightsPublished

torch.set_num_threads(1)
WORKDIR = Path(__file__).resolve().parents[1] / ".work" / "test-models"
TINY = ModelConfig(bootstrap_sft_seconds=5.0, bootstrap_reading_states=20)


@pytest.fixture(scope="module")
def trainable():
    return load_trainable(TINY, role="policy", workdir=WORKDIR)


def nudged(model, scale: float = 0.05):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


def test_publish_writes_a_verified_folder_that_from_pretrained_loads(tmp_path, trainable):
    model, tok = trainable
    store = WeightStore(str(tmp_path / "store"))
    ev = store.publish("policy", 7, model, tok, preset="tiny", optimizer_step=21)
    folder = Path(ev.uri)
    assert folder == tmp_path / "store" / "policy" / "v000007"
    assert ev.sha256 == sha256_file(folder / "model.safetensors")
    assert ev.bytes == (folder / "model.safetensors").stat().st_size and ev.optimizer_step == 21
    assert not list(folder.parent.glob(".tmp-*"))
    snapshot = store.fetch(ev)  # a private copy, hashed as it was copied: what is loaded is what was checked
    assert snapshot != folder and sha256_file(snapshot / "model.safetensors") == ev.sha256
    loaded = AutoModelForCausalLM.from_pretrained(str(folder))  # users can take it anywhere
    ids = torch.tensor([[1, 5, 9, 12]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model.eval()(ids).logits, atol=1e-6)


def test_prune_keeps_the_last_versions(tmp_path, trainable):
    model, tok = trainable
    store = WeightStore(str(tmp_path), keep_last=2)
    for v in range(1, 5):
        store.publish("reward", v, model, None)
    assert store.versions("reward") == [3, 4]
    assert store.versions("policy") == []


def test_publish_sweeps_the_leftovers_of_killed_writes(tmp_path, trainable):
    """A kill during a publish leaves `.tmp-*` (staging) or `.old-*` (a replaced version): the next
    publish removes those older than LEFTOVER_AGE_S and leaves a fresh one (a writer may own it)."""
    import os

    from infra.weights import LEFTOVER_AGE_S

    model, _ = trainable
    store = WeightStore(str(tmp_path), keep_last=2)
    parent = tmp_path / "reward"
    stale = [parent / ".tmp-v000001-dead", parent / ".old-v000002-dead"]
    fresh = parent / ".tmp-v000003-live"
    for folder in [*stale, fresh]:
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"half-written")
    for folder in stale:
        old = folder.stat().st_mtime - LEFTOVER_AGE_S - 60
        os.utime(folder, (old, old))
    store.publish("reward", 1, model, None)
    assert not any(f.exists() for f in stale) and fresh.is_dir()
    assert store.versions("reward") == [1]


def test_fsspec_url_round_trip(trainable):
    model, tok = trainable
    store = WeightStore("memory://fs-test-store", cache_dir=None)
    ev = store.publish("policy", 1, model, tok)
    assert ev.uri == "memory:///fs-test-store/policy/v000001"
    folder = store.fetch(ev)
    assert sha256_file(folder / "model.safetensors") == ev.sha256


def test_only_the_stores_own_folder_is_read_whatever_the_event_says(tmp_path, trainable):
    model, tok = trainable
    store = WeightStore(str(tmp_path / "store"), cache_dir=tmp_path / "cache")
    elsewhere = WeightStore(str(tmp_path / "elsewhere")).publish("policy", 1, nudged(model), tok)
    backend = HFBackend(prepare_preset(TINY, role="policy", workdir=WORKDIR))
    watcher = WeightsWatcher(bus=None, store=store, model_name="policy")  # type: ignore[arg-type]
    remote = msgspec.structs.replace(elsewhere, version=2, uri="http://127.0.0.1:1/policy/v000002")
    for forged in (elsewhere, remote):  # valid weights, a matching sha256, the wrong place
        with pytest.raises(WeightsRejected, match="not this run's weight store"):
            store.fetch(forged)
        watcher.observe(forged)
        assert watcher.apply(backend) is None
    assert watcher.refused == 2 and backend.version == 0
    # the store's own folder under a spelling of the same path is fine
    ev = store.publish("policy", 3, model, tok)
    assert store.fetch(msgspec.structs.replace(ev, uri=str(tmp_path / "store" / "." / "policy" / "v000003")))


def test_snapshots_are_pruned_to_keep_last(tmp_path, trainable):
    model, tok = trainable
    store = WeightStore(str(tmp_path / "store"), keep_last=2, cache_dir=tmp_path / "cache")
    for v in range(1, 6):
        store.fetch(store.publish("reward", v, model, None))
    folder = tmp_path / "cache" / "snapshots" / "reward"
    dead = folder / "v000001-0123456789abcdef-999999999-deadbeef"  # a process that no longer exists
    dead.mkdir()
    store.fetch(store.publish("reward", 6, model, None))
    assert sorted(p.name[:7] for p in folder.iterdir()) == ["v000005", "v000006"]


def test_tampered_and_non_safetensors_weights_are_refused_and_old_weights_kept(tmp_path, trainable):
    model, tok = trainable
    store = WeightStore(str(tmp_path))
    backend = HFBackend(prepare_preset(TINY, role="policy", workdir=WORKDIR))
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    prompt = ["Task: put a spoon in table 1."]

    # 1. a flipped byte in the tensor data: sha256 mismatch
    ev = store.publish("policy", 1, nudged(model), tok)
    weights = Path(ev.uri) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(WeightsRejected, match="sha256 mismatch"):
        store.fetch(ev)

    # 2. a pickle renamed to model.safetensors, with a matching hash in the event
    torch.save(model.state_dict(), weights)
    forged = WeightsPublished(model="policy", version=1, uri=ev.uri, sha256=sha256_file(weights), bytes=1)
    with pytest.raises(WeightsRejected, match="not a safetensors file"):
        store.fetch(forged)
    with pytest.raises(WeightsRejected, match="not a safetensors file"):
        backend.load_weights(1, Path(ev.uri))

    # 3. a pickle checkpoint beside valid weights
    ev2 = store.publish("policy", 2, model, tok)
    torch.save({}, Path(ev2.uri) / "pytorch_model.bin")
    with pytest.raises(WeightsRejected, match="pickle"):
        store.fetch(ev2)

    # 4. valid safetensors of the wrong shapes
    (tmp_path / "wrong").mkdir()
    from safetensors.torch import save_file

    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(tmp_path / "wrong" / "model.safetensors"))
    with pytest.raises(WeightsRejected, match="do not fit"):
        backend.load_weights(3, tmp_path / "wrong")

    # the watcher remembers refusals and the backend still serves version 0, unchanged
    watcher = WeightsWatcher(bus=None, store=store, model_name="policy")  # type: ignore[arg-type]
    watcher.observe(forged)
    assert watcher.apply(backend) is None and watcher.newer_than(0) is None
    assert backend.version == 0
    after = backend.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert backend.generate(prompt, temperature=0.0, max_tokens=4)[0][0].version == 0


def test_watcher_apply_loads_the_newest_version(tmp_path, trainable):
    model, tok = trainable
    store = WeightStore(str(tmp_path))
    backend = HFBackend(prepare_preset(TINY, role="policy", workdir=WORKDIR))
    watcher = WeightsWatcher(bus=None, store=store, model_name="policy")  # type: ignore[arg-type]
    watcher.observe(store.publish("reward", 9, model, tok))  # other model: ignored
    assert watcher.newer_than(0) is None
    for v in (1, 2):
        watcher.observe(store.publish("policy", v, nudged(model), tok))
    assert watcher.apply(backend) == 2 and backend.version == 2
    assert watcher.apply(backend) is None
    out = backend.generate(["Task:"], temperature=0.8, max_tokens=6, seed=0)[0][0]
    assert out.version == 2


async def test_watcher_follows_forge_weights_from_the_beginning(kafka_config, tmp_path, trainable):
    from infra.bus import Bus
    from schemas.topics import WEIGHTS

    model, tok = trainable
    store = WeightStore(str(tmp_path))
    events = [store.publish(m, v, model, tok) for m, v in [("policy", 1), ("reward", 4), ("policy", 2)]]
    async with Bus(kafka_config, role="test-weights") as bus:
        for ev in events[:2]:
            await bus.send(WEIGHTS, ev, key=ev.model)
        watcher = WeightsWatcher(bus, store, "policy")
        shutdown = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(watcher.run, shutdown)
            with anyio.fail_after(30):
                assert (await watcher.wait_newer_than(0)).version == 1  # published before we started
                await bus.send(WEIGHTS, events[2], key="policy")
                got = await watcher.wait_newer_than(1)
            assert got.version == 2 and got.sha256 == events[2].sha256
            shutdown.set()
    assert json.loads((Path(got.uri) / "config.json").read_text())["hidden_size"] == 128


@pytest.fixture
def small_disk(tmp_path):
    """A real full disk: a tmpfs of a few MB (needs root, as CI runs here; skipped elsewhere)."""
    import subprocess

    mounted = []

    def mount(megabytes: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(where)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_store_prunes_then_fails_clearly_and_never_half_writes(small_disk, trainable):
    from infra.weights import StoreFull

    model, tok = trainable
    disk = small_disk(8)  # room for two versions of the tiny model (3.4 MB each with its tokenizer)
    store = WeightStore(str(disk), keep_last=5)
    for v in (1, 2, 3):  # v3 does not fit next to v1 and v2: the older ones go, then it is written
        store.publish("policy", v, model, tok)
    assert store.versions("policy")[-1] == 3 and len(store.versions("policy")) < 3
    assert not list((disk / "policy").glob(".tmp-*"))
    fetched = store.fetch(store.publish("policy", 4, model, tok))  # still a verified, loadable version
    assert (fetched / "model.safetensors").is_file()

    tiny_disk = small_disk(1)  # nothing fits: a clear error, no version, nothing half-written
    store = WeightStore(str(tiny_disk), keep_last=5)
    with pytest.raises(
        StoreFull, match=r"publishing policy v1: no space left in .* bytes free after pruning"
    ):
        store.publish("policy", 1, model, tok)
    assert store.versions("policy") == [] and not list((tiny_disk / "policy").glob(".tmp-*"))


def test_a_full_checkpoint_folder_keeps_the_newest_checkpoint_and_fails_clearly(small_disk, trainable):
    from infra.weights import StoreFull
    from learners import checkpoint as ckpt

    model, _ = trainable
    state = ckpt.LearnerState()
    root = small_disk(8)  # room for two checkpoints of the tiny model (~3.2 MB each): the newest is kept
    for step in (1, 2, 3, 4):
        state.optimizer_step = step
        ckpt.save_checkpoint(root, state, model, {}, keep_last=10)
    names = [p.name for p in ckpt.complete_checkpoints(root)]
    assert names[-1].endswith("00000004") and len(names) < 4 and not list(root.glob(".tmp-*"))
    root = small_disk(1)
    with pytest.raises(StoreFull, match="checkpoint .*: no space left"):
        ckpt.save_checkpoint(root, state, model, {})
    assert ckpt.complete_checkpoints(root) == [] and not list(root.glob(".tmp-*"))
