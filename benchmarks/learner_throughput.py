"""Learner tokens/s: plain torch AdamW vs DeepSpeed ZeRO-1/2/3 (CPU accelerator), same batches.

Model: the `tiny` preset's architecture (learners.tiny_preset.TINY_ARCH) with random weights (the
SFT bootstrap does not change the cost of a step). Batch: 32 samples of 96 prompt + 32 response
tokens (household-sized), one micro-batch (4096-token budget), decoupled-PPO loss, one optimizer
step per batch — exactly `learners.core.Trainer.step`. tokens/s counts prompt + response tokens.
Each engine runs in its own process (one process group each), one warm-up step then `--steps`
timed steps; engines run interleaved `--repeats` times and the best rate is kept (shared machine).
ZeRO-2 under torchrun x 2 is measured too (both ranks share this machine's cores; aggregate rate).

`--role`: the policy-learner role itself (`forgestream run policy-learner`, ZeRO-2) on 1 and on 2
torchrun ranks, through a broker: `--groups` sample groups of 64 household-sized samples wait on the
samples topic, and the rate is samples trained per second between the publishes of v1 and of the last
version (reading Kafka, sharing each batch across ranks, the reference-KL forward, checkpoints and
weight publishes included; the first batch's warm-up is not).

    python -m benchmarks.learner_throughput [--steps 5] [--repeats 2] [--out benchmarks/results/learner.json]
    python -m benchmarks.learner_throughput --role [--groups 16] [--out benchmarks/results/learner_role.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES, PROMPT, RESPONSE, VOCAB = 32, 96, 32, 1024
CASES = [("torch", 0, 1), ("deepspeed", 1, 1), ("deepspeed", 2, 1), ("deepspeed", 3, 1), ("deepspeed", 2, 2)]


def worker(engine_name: str, stage: int, steps: int) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from learners.checkpoint import TrainSample
    from learners.core import Trainer
    from learners.engine import build_engine
    from learners.tiny_preset import TINY_ARCH
    from schemas.config import LearnerConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, **TINY_ARCH)).float().eval()
    params = sum(p.numel() for p in model.parameters())
    cfg = LearnerConfig(lr=1e-4, engine=engine_name, zero_stage=stage, micro_batch_tokens=4096)
    start = time.perf_counter()
    engine = build_engine(model, cfg)
    init_s = time.perf_counter() - start
    g = torch.Generator().manual_seed(1)
    batch = [
        TrainSample(
            key=str(i),
            prompt_ids=torch.randint(4, VOCAB, (PROMPT,), generator=g).tolist(),
            response_ids=torch.randint(4, VOCAB, (RESPONSE,), generator=g).tolist(),
            behaviour_logprobs=[-7.0] * RESPONSE,
            version=0,
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(SAMPLES)
    ]
    shard = batch[engine.rank :: engine.world_size]
    trainer = Trainer(engine, cfg, temperature=0.8)
    trainer.step(shard)  # warm-up
    times = []
    for _ in range(steps):
        times.append(trainer.step(shard).seconds)
    tokens = SAMPLES * (PROMPT + RESPONSE)  # the whole batch, across ranks
    step_s = sorted(times)[len(times) // 2]
    return {
        "engine": engine_name,
        "zero_stage": stage if engine_name == "deepspeed" else None,
        "processes": engine.world_size,
        "params": params,
        "engine_init_s": round(init_s, 3),
        "median_step_s": round(step_s, 4),
        "tokens_per_s": round(tokens / step_s, 1),
    }


def run_case(engine_name: str, stage: int, procs: int, steps: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    args = ["--worker", engine_name, str(stage), "--steps", str(steps)]
    if procs > 1:
        from learners.engine import _free_port

        launcher = [
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(procs),
            "--master_port",
            str(_free_port()),
        ]
        cmd = [sys.executable, *launcher, str(Path(__file__)), *args]
    else:
        cmd = [sys.executable, "-m", "benchmarks.learner_throughput", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{cmd} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads(lines[0].removeprefix("RESULT "))


GROUP = 64  # samples per group (one rollout request)


async def _publish_groups(bootstrap: str, groups: int, vocab: int) -> None:
    import random

    from infra.bus import Bus
    from infra.topics import create_topics
    from schemas.config import KafkaConfig
    from schemas.events import PolicySample, PolicySampleBatch
    from schemas.topics import SAMPLES_POLICY

    kafka = KafkaConfig(bootstrap=bootstrap)
    await create_topics(kafka)
    rng = random.Random(0)
    async with Bus(kafka, role="bench") as bus:
        for g in range(groups):
            samples = [
                PolicySample(
                    sample_key=f"g{g}/{i}/0",
                    task_id=f"t{g}",
                    policy_version=0,
                    prompt_token_ids=[rng.randrange(4, vocab) for _ in range(PROMPT)],
                    response_token_ids=[rng.randrange(4, vocab) for _ in range(RESPONSE)],
                    behaviour_logprobs=[-7.0] * RESPONSE,
                    advantage=1.0 if i % 2 else -1.0,
                    reward=1.0 if i % 2 else -1.0,
                )  # fmt: skip
                for i in range(GROUP)
            ]
            await bus.send(
                SAMPLES_POLICY, PolicySampleBatch(request_id=f"g{g}", samples=samples), key=f"g{g}"
            )


async def _published(bootstrap: str) -> list[tuple[int, float]]:
    from infra.bus import Bus
    from schemas.config import KafkaConfig
    from schemas.topics import WEIGHTS

    async with Bus(KafkaConfig(bootstrap=bootstrap), role="bench") as bus:
        records = await bus.read_topic(WEIGHTS, latest_per_key=False)
    return [(r.value.version, r.timestamp_ms / 1000.0) for r in records if r.value.model == "policy"]


def role_case(ranks: int, groups: int, batch_samples: int) -> dict:
    """The policy-learner role on `ranks` processes through a fresh ephemeral broker."""
    import shutil
    import signal
    import tempfile

    import anyio

    from benchmarks import child_env
    from infra.broker import Broker
    from infra.models import load_trainable
    from schemas.config import ModelConfig

    versions = groups * GROUP // batch_samples
    workdir = Path(tempfile.mkdtemp(prefix="forgestream-learner-role-"))
    vocab = load_trainable(ModelConfig(), role="policy", workdir=workdir)[0].config.vocab_size
    env = child_env(FORGESTREAM_POLICY_LEARNER__ENGINE="deepspeed", FORGESTREAM_POLICY_LEARNER__ZERO_STAGE="2",
                    FORGESTREAM_POLICY_LEARNER__BATCH_SAMPLES=str(batch_samples),
                    FORGESTREAM_POLICY_LEARNER__BATCH_WAIT_S="0", FORGESTREAM_OFF_POLICY__ETA="1000",
                    PYTHONPATH=str(ROOT),
                    TORCH_EXTENSIONS_DIR=str(ROOT / ".cache" / "torch_extensions"))  # fmt: skip
    role = ["-m", "app.cli", "run", "policy-learner", "--workdir", str(workdir)]
    with Broker() as broker:
        anyio.run(_publish_groups, broker.bootstrap, groups, vocab)
        if ranks > 1:
            from app.ranks import torchrun_argv

            cmd = [*torchrun_argv(ranks, "policy-learner"), "--workdir", str(workdir)]
        else:
            cmd = [sys.executable, *role]
        with open(workdir / "learner.log", "wb") as log:
            proc = subprocess.Popen([*cmd, "--bootstrap", broker.bootstrap], cwd=ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 900
            while True:
                published = dict(anyio.run(_published, broker.bootstrap))
                if max(published, default=-1) >= versions:
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"learner on {ranks} ranks stopped short: {(workdir / 'learner.log').read_text()[-3000:]}"
                    )
                time.sleep(1.0)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    shutil.rmtree(workdir, ignore_errors=True)
    seconds = published[versions] - published[1]
    trained = (versions - 1) * batch_samples
    return {"ranks": ranks, "versions": versions, "samples_timed": trained, "seconds": round(seconds, 2),
            "samples_per_s": round(trained / seconds, 2)}  # fmt: skip


def main_role(groups: int, out: Path) -> None:
    batch_samples = 256
    cases = [role_case(ranks, groups, batch_samples) for ranks in (1, 2)]
    for case in cases:
        print(case, flush=True)
    report = {
        "benchmark": "learner_role_ranks",
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus, torch threads 1, python {platform.python_version()}",
        "model": "tiny preset", "engine": "deepspeed ZeRO-2", "batch_samples": batch_samples,
        "sample": {"prompt_tokens": PROMPT, "response_tokens": RESPONSE}, "groups": groups, "cases": cases,
        "two_ranks_over_one": round(cases[1]["samples_per_s"] / cases[0]["samples_per_s"], 3),
    }  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("two_ranks_over_one",)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--out", type=Path, default=None, help="results JSON (default: learner.json, learner_role.json)"
    )
    parser.add_argument(
        "--role", action="store_true", help="the policy-learner role on 1 and 2 ranks, through Kafka"
    )
    parser.add_argument(
        "--groups", type=int, default=16, help="--role: sample groups of 64 waiting on the topic"
    )
    parser.add_argument("--worker", nargs=2, metavar=("ENGINE", "STAGE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    results = ROOT / "benchmarks" / "results"
    if args.role:
        return main_role(args.groups, args.out or results / "learner_role.json")
    args.out = args.out or results / "learner.json"
    if args.worker:
        result = worker(args.worker[0], int(args.worker[1]), args.steps)
        if int(os.environ.get("RANK", "0")) == 0:
            print("RESULT " + json.dumps(result), flush=True)
        return
    best: dict[str, dict] = {}
    for _ in range(args.repeats):
        for engine_name, stage, procs in CASES:
            label = (
                engine_name
                if engine_name == "torch"
                else f"deepspeed-zero{stage}" + (f"-x{procs}" if procs > 1 else "")
            )
            r = run_case(engine_name, stage, procs, args.steps)
            print(label, r, flush=True)
            if label not in best or r["tokens_per_s"] > best[label]["tokens_per_s"]:
                best[label] = r
    plain = best["torch"]["tokens_per_s"]
    report = {
        "benchmark": "learner_throughput",
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus, torch threads 1, python {platform.python_version()}",
        "batch": {"samples": SAMPLES, "prompt_tokens": PROMPT, "response_tokens": RESPONSE, "vocab": VOCAB},
        "steps": args.steps,
        "repeats": args.repeats,
        "cases": best,
        "relative_to_torch": {k: round(v["tokens_per_s"] / plain, 3) for k, v in best.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["relative_to_torch"]))


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    main()
