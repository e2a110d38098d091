"""Learner tokens/s: plain torch AdamW vs DeepSpeed ZeRO-1/2/3 (CPU accelerator), same batches.

Model: the `tiny` preset's architecture (infra.models.presets.TINY_ARCH) with random weights (the
SFT bootstrap does not change the cost of a step). Batch: 32 samples of 96 prompt + 32 response
tokens (household-sized), one micro-batch (4096-token budget), decoupled-PPO loss, one optimizer
step per batch — exactly `learners.core.Trainer.step`. tokens/s counts prompt + response tokens.
Each engine runs in its own process (one process group each), one warm-up step then `--steps`
timed steps; engines run interleaved `--repeats` times and the best rate is kept (shared machine).
ZeRO-2 under torchrun x 2 is measured too (both ranks share this machine's cores; aggregate rate).

    python -m benchmarks.learner_throughput [--steps 5] [--repeats 2] [--out benchmarks/results/learner.json]
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

    from infra.models.presets import TINY_ARCH
    from learners.checkpoint import TrainSample
    from learners.core import Trainer
    from learners.engine import build_engine
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "learner.json")
    parser.add_argument("--worker", nargs=2, metavar=("ENGINE", "STAGE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
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
