"""DeepSpeed engine: same batches, same losses as plain torch (within a stated tolerance).

Tolerance: per-step loss |DeepSpeed - torch| <= 1e-5 and every weight within 1e-4 after four AdamW
steps at lr 1e-2 (1 % of one step). Both engines run torch's AdamW; ZeRO flattens and partitions the
fp32 state and reduces gradients in another order, so only float rounding differs. Measured here:
loss <= 1e-7 (ZeRO-1/2/3 and ZeRO-2 x 2 processes); weights 1.2e-7 (ZeRO-1/2), 6e-6 (ZeRO-3),
3.8e-5 (ZeRO-2 under torchrun x 2, where each rank's half-batch gradients are averaged).

DeepSpeed runs in subprocesses (this file is also the worker script), so no process group or RANK
environment leaks into the pytest process; the first DeepSpeed start ever compiles a communication
op (~30 s, cached in .cache/torch_extensions).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # when torchrun runs this file as a script
    sys.path.insert(0, str(ROOT))

from learners.core import Trainer  # noqa: E402
from learners.engine import DeepSpeedEngine, TorchEngine  # noqa: E402
from tests.test_learners import fixed_batch, learner_config, tiny_llama  # noqa: E402

TOL = 1e-5  # loss
PARAM_TOL = 1e-4  # weights after 4 steps at lr 1e-2: 1 % of one step
STEPS = 4


def params(engine) -> dict[str, torch.Tensor]:
    with engine.full_parameters():
        return {n: p.detach().clone() for n, p in engine.model.named_parameters()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def torch_reference(batch, cfg) -> tuple[list[float], dict[str, torch.Tensor]]:
    engine = TorchEngine(tiny_llama(0), cfg)
    trainer = Trainer(engine, cfg, 0.8)
    return [trainer.step(batch).loss for _ in range(STEPS)], params(engine)


def worker(stage: int, out: Path, restore: bool) -> None:
    """Train STEPS steps under DeepSpeed ZeRO-`stage`; each rank takes an equal share of the batch."""
    torch.set_num_threads(1)
    cfg = learner_config(engine="deepspeed", zero_stage=stage)
    batch = fixed_batch(6)
    engine = DeepSpeedEngine(tiny_llama(0), cfg)
    rank, world = engine.rank, engine.world_size
    shard = batch[rank::world]
    trainer = Trainer(engine, cfg, 0.8)
    losses, saved = [], None
    for step in range(STEPS):
        loss = torch.tensor(trainer.step(shard).loss)
        torch.distributed.all_reduce(loss)  # equal shards: the mean of shard means is the batch mean
        losses.append(float(loss) / world)
        if step == 1:
            saved = (params(engine), *engine.optimizer_state())
    final = params(engine)
    result = {"stage": stage, "world": world, "losses": losses}
    if restore:  # restart from the step-2 state: into a fresh DeepSpeed engine and into plain torch
        for kind in ("deepspeed", "torch"):
            model = tiny_llama(7)
            model.load_state_dict(saved[0], strict=False)
            again = DeepSpeedEngine(model, cfg) if kind == "deepspeed" else TorchEngine(model, cfg)
            again.load_optimizer_state(saved[1], saved[2])
            t = Trainer(again, cfg, 0.8)
            for _ in range(STEPS - 2):
                t.step(shard)
            result[f"restore_{kind}_max_diff"] = max_diff(params(again), final)
    ref_losses, ref_params = torch_reference(batch, learner_config())
    result["loss_max_diff"] = max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True))
    result["param_max_diff"] = max_diff(final, ref_params)
    if rank == 0:
        out.write_text(json.dumps(result))


def run_worker(args: list[str], tmp_path: Path, timeout: int = 300) -> dict:
    out = tmp_path / "result.json"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
        "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions"),
    }
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    proc = subprocess.run(
        [*args, str(Path(__file__)), "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    print(result)
    return result


@pytest.mark.deepspeed
def test_zero_stages_match_torch_and_restore(tmp_path: Path) -> None:
    """ZeRO-1/2/3 in one process: losses and weights match plain torch; a restart from exported
    optimizer state (into DeepSpeed or into plain torch) continues exactly."""
    results = run_worker([sys.executable], tmp_path)
    for r in results["stages"]:
        assert r["loss_max_diff"] <= TOL, r
        assert r["param_max_diff"] <= PARAM_TOL, r
        assert r["restore_deepspeed_max_diff"] <= PARAM_TOL, r
        assert r["restore_torch_max_diff"] <= PARAM_TOL, r


@pytest.mark.deepspeed
def test_zero2_torchrun_two_processes(tmp_path: Path) -> None:
    """ZeRO-2 data parallel over 2 processes (gloo): each rank trains half the batch; the averaged
    gradients give the same update as plain torch on the whole batch."""
    from learners.engine import _free_port

    port = str(_free_port())
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port]
    r = run_worker([*torchrun], tmp_path, timeout=300)
    (r,) = r["stages"]
    assert r["world"] == 2 and r["stage"] == 2
    assert r["loss_max_diff"] <= TOL, r
    assert r["param_max_diff"] <= PARAM_TOL, r


@pytest.mark.deepspeed
async def test_a_learner_spans_two_ranks(tmp_path: Path, kafka_config) -> None:
    """`torchrun --nproc_per_node 2 -m app.cli run policy-learner` (DeepSpeed ZeRO-2, gloo): rank 0
    reads the samples and shares each batch, both ranks train their half of every step (the
    collectives would stall otherwise); every key trains once, versions advance, only rank 0 writes
    the journal, the checkpoints and the weights, and after kill -9 of the whole world a restart
    continues from the checkpoint."""

    import msgspec

    from learners import checkpoint as ckpt
    from learners.engine import _free_port
    from schemas import topics
    from tests.conftest import eventually
    from tests.test_learners import (
        lineage_keys,
        read_values,
        role_config,
        sample_batch,
        send_batches,
        wait_for_version,
    )

    config = role_config(tmp_path, kafka_config, engine="deepspeed", zero_stage=2, minibatches=2, eta=100)
    root = Path(config.workdir) / "checkpoints" / "policy"
    config_path, log = tmp_path / "config.toml", tmp_path / "learner.log"
    config_path.write_text(toml(msgspec.to_builtins(config)))
    batches = [sample_batch(f"r{i}", 4) for i in range(3)]
    all_keys = sorted(s.sample_key for b in batches for s in b.samples)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false",
           "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions")}  # fmt: skip
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)

    def start() -> subprocess.Popen:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                    "--master_port", str(_free_port()), "-m", "app.cli", "run", "policy-learner",
                    "--config", str(config_path)]  # fmt: skip
        with open(log, "ab") as out:
            return subprocess.Popen(torchrun, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip

    procs = [start()]
    try:
        await send_batches(kafka_config, batches[:2])
        await wait_for_version(kafka_config, 2, 240)
        await eventually(lambda: ckpt.latest_checkpoint(root).name == "step-00000004", 60, "v2's checkpoint")
        procs[0].kill()  # kill -9 of torchrun's agent: both ranks die with it
        procs[0].wait(10)
        await eventually(lambda: not ranks_alive(config_path), 30, "the ranks to die with their agent")
        procs.append(start())
        await send_batches(kafka_config, batches[2:])
        await eventually(lambda: sorted(lineage_keys(root)) == all_keys, 240, "every key in the lineage")
        await wait_for_version(kafka_config, 3, 60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        subprocess.run(["pkill", "-9", "-f", str(config_path)], check=False)  # if a rank outlived its agent
    print(log.read_text()[-3000:])
    journal = [json.loads(x) for x in (root / "journal.jsonl").read_text().splitlines() if x.strip()]
    assert {"restored_step": 4, "from": "step-00000004"} in journal  # written once, by rank 0
    steps = [e for e in journal if "step" in e]
    assert [e["step"] for e in steps] == [1, 2, 3, 4, 5, 6]  # two steps a batch, written once
    assert all(len(e["keys"]) == 2 for e in steps)  # a step's samples: one on each rank
    keys = lineage_keys(root)
    assert len(keys) == len(set(keys)) == 12
    weights = [w.version for w in await read_values(kafka_config, topics.WEIGHTS) if w.model == "policy"]
    assert weights == [0, 1, 2, 3]
    assert ckpt.load_state(ckpt.latest_checkpoint(root)).version == 3


@pytest.mark.deepspeed
@pytest.mark.timeout(420)
async def test_up_runs_a_learner_on_two_ranks_that_die_with_it(tmp_path: Path) -> None:
    """`policy_learner.ranks = 2`: `up` starts the policy learner under torchrun (two `run
    policy-learner` ranks under one agent); both ranks join one world (v0's publish needs both); a
    kill -9 of `up` takes the agent and both ranks with it."""
    import signal

    from schemas import topics
    from schemas.config import KafkaConfig
    from tests.conftest import TEST_PRESETS, eventually, wait_for
    from tests.test_e2e import CLI, env_for_tests
    from tests.test_learners import read_values

    workdir = tmp_path / "run"
    others = ["env-model", "reward-learner", "evaluator"]  # what `up` may leave out
    env = env_for_tests() | {"FORGESTREAM_POLICY_LEARNER__RANKS": "2", "FORGESTREAM_POLICY_LEARNER__ENGINE": "deepspeed",
                             "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions")}  # fmt: skip
    with open(tmp_path / "up.log", "wb") as log:
        up = subprocess.Popen([*CLI, "up", "--ephemeral", "--no-live", "--minutes", "10", "--workdir", str(workdir),
                               "--config", str(TEST_PRESETS), *[a for role in others for a in ("--without", role)]],
                              cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:

        def broker() -> dict | None:
            assert up.poll() is None, (tmp_path / "up.log").read_text()[-2000:]
            return (workdir / "broker.json").is_file() and json.loads((workdir / "broker.json").read_text())

        info = wait_for(broker, 180, "the broker of `up`")
        kafka = KafkaConfig(bootstrap=info["bootstrap"], session_timeout_s=6.0)

        async def v0_published() -> bool:
            return any(w.model == "policy" for w in await read_values(kafka, topics.WEIGHTS))

        await eventually(v0_published, 240, "the two-rank learner's v0")
        [agent] = [pid for pid in children(up.pid) if b"torch.distributed.run" in cmdline(pid)]
        ranks = children(agent)
        assert len(ranks) == 2 and all(cmdline(r).endswith(b"run\0policy-learner\0") for r in ranks)
        os.kill(up.pid, signal.SIGKILL)
        up.wait(10)
        await eventually(lambda: not any(running(p) for p in [agent, *ranks]), 60,
                         "the agent and its ranks to die with `up`")  # fmt: skip
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
        print((tmp_path / "up.log").read_text()[-3000:])
        for log in sorted((workdir / "logs").glob("*.log")):
            print(log.name, log.read_text()[-2000:])


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (zombies included until reaped)."""
    out = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return out


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie lingers where pid 1 does not reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def ranks_alive(config_path: Path) -> bool:
    """Whether a process started with this config file still runs."""
    return subprocess.run(["pgrep", "-f", str(config_path)], capture_output=True).returncode == 0


def toml(tree: dict) -> str:
    """A config as TOML (`--config`): top-level values, then one table per section."""
    top, sections = [], []
    for key, value in tree.items():
        if isinstance(value, dict):
            sections += [f"[{key}]"] + [f"{k} = {json.dumps(v)}" for k, v in value.items() if v is not None]
        elif value is not None:
            top.append(f"{key} = {json.dumps(value)}")
    return "\n".join(top + sections) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torchrun = "LOCAL_RANK" in os.environ
    stages = [2] if torchrun else [1, 2, 3]
    results = []
    for stage in stages:
        part = args.out.with_suffix(f".{stage}.json")
        worker(stage, part, restore=not torchrun)
        if part.exists():
            results.append(json.loads(part.read_text()))
    if not torchrun or int(os.environ["RANK"]) == 0:
        args.out.write_text(json.dumps({"stages": results}))


if __name__ == "__main__":
    main()


@pytest.mark.deepspeed
async def test_policy_role_on_deepspeed_restarts_from_checkpoint(tmp_path: Path, kafka_config) -> None:
    """The policy learner role with engine = "deepspeed" (ZeRO-2): trains, publishes, checkpoints;
    after kill -9 it restores model + optimizer into a fresh DeepSpeed engine and continues."""
    import msgspec

    from learners import checkpoint as ckpt
    from schemas import topics
    from tests.conftest import eventually
    from tests.test_learners import (
        lineage_keys,
        read_values,
        role_config,
        sample_batch,
        send_batches,
        start_learner,
        wait_for_version,
    )

    config = role_config(tmp_path, kafka_config, engine="deepspeed", zero_stage=2, eta=100)
    root = Path(config.workdir) / "checkpoints" / "policy"
    config_path, log = tmp_path / "config.json", tmp_path / "learner.log"
    config_path.write_bytes(msgspec.json.encode(config))
    procs = [start_learner(config_path, log)]
    try:
        await send_batches(kafka_config, [sample_batch("d0", 4), sample_batch("d1", 4)])
        await eventually(
            lambda: (c := ckpt.latest_checkpoint(root)) and c.name == "step-00000002", 120, "2 steps"
        )
        procs[0].kill()
        procs[0].wait(10)
        procs.append(start_learner(config_path, log))
        await send_batches(kafka_config, [sample_batch("d2", 4)])
        await eventually(
            lambda: (c := ckpt.latest_checkpoint(root)) and c.name == "step-00000003", 120, "3rd step"
        )
        await wait_for_version(kafka_config, 3, 60)  # the publish follows its checkpoint
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    keys = lineage_keys(root)
    assert len(keys) == len(set(keys)) == 12, keys
    events = [w for w in await read_values(kafka_config, topics.WEIGHTS) if w.model == "policy"]
    versions = [w.version for w in events]  # v2 is sent again if the kill beat its announcement
    assert sorted(set(versions)) == [0, 1, 2, 3] and versions == sorted(versions)
    # the published v3 (plain HF folder) holds exactly the checkpointed weights
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    published = AutoModelForCausalLM.from_pretrained(events[-1].uri).state_dict()
    saved = load_file(str(ckpt.latest_checkpoint(root) / "model.safetensors"))
    assert all(torch.equal(published[n], t) for n, t in saved.items())
    state = ckpt.load_state(ckpt.latest_checkpoint(root))
    assert state.optimizer_step == 3 and state.version == 3
    assert "restored_step" in (root / "journal.jsonl").read_text()
