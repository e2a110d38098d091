"""The policy update in isolation: does the learner's step, fed whole on-policy groups, raise success?

A loop's own numbers mix everything (the reward model, staleness, the task forge, shared cores). This
bench keeps only the update: one process plays `--tasks` household tasks `n` times each with the policy
(transformers backend, the policy's temperature), labels every step with the environment's own label
(`--labels oracle`: the judge's `oracle` verdicts, m copies) or not at all (`outcome`: RLVR, λ = 0),
computes each group's targets with `algorithm.group_signals` (the signals config: mixed groups only,
episode weighting) and trains them with `learners.core.Trainer` (the policy learner's config: lr,
epochs, minibatches, clip, both KLs, warm-up). A version is a batch of whole groups of at least
`--batch-samples` samples (0: the whole iteration); the sampler then loads the newest weights, or
those `--lag` versions older (off-policy, as the loop's η).
Per iteration: success of that iteration's rollouts (on-policy; with `--fresh`, on tasks never seen
before). Before and after: held-out success at `--level` (`pipeline.evaluation.evaluate_policy`, the
eval's held-out seeds), so a gain on the training tasks and its transfer are told apart.

    python benchmarks/policy_update.py [--iters 6] [--tasks 16] [--fresh] [--labels oracle|outcome]
        [--batch-samples 0] [--lag 0] [--heldout 200] [--out benchmarks/results/policy_update.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LEARNER_FIELDS = ("lr", "epochs", "minibatches", "clip", "kl_coef", "ref_kl_coef", "warmup_steps")


def versions(samples: list, at_least: int) -> list[list]:
    """The iteration's samples cut into versions as the learner cuts its batches (`whole_groups`: whole
    groups, in order, each version at least `at_least` samples); 0: the whole iteration is one version."""
    from learners.core import whole_groups

    if at_least <= 0:
        return [samples] if samples else []
    out, rest = [], samples
    while rest:
        out.append(whole_groups(rest, at_least))
        taken = {s.key for s in out[-1]}
        rest = [s for s in rest if s.key not in taken]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=16, help="tasks per iteration (groups)")
    ap.add_argument("--level", type=int, default=4)
    ap.add_argument("--fresh", action="store_true", help="new tasks every iteration")
    ap.add_argument("--labels", choices=["oracle", "outcome"], default="oracle")
    ap.add_argument("--batch-samples", type=int, default=0, help="samples per version (0: one per iteration)")
    ap.add_argument("--lag", type=int, default=0, help="versions the sampler runs behind the learner")
    ap.add_argument("--heldout", type=int, default=200, help="held-out tasks before and after (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "policy_update.json")
    args = ap.parse_args()
    os.environ.setdefault("FORGESTREAM_HOME", str(ROOT / ".cache" / "forgestream"))

    import msgspec
    import torch

    from algorithm import group_signals
    from envs import get_environment
    from envs.play import label_verdict, play_tasks
    from infra.models import load_backend, load_trainable
    from learners import tiny_preset  # noqa: F401  (registers the `tiny` preset's recipe)
    from learners.checkpoint import TrainSample
    from learners.core import Trainer, reference_weights
    from learners.engine import build_engine
    from pipeline.evaluation import evaluate_policy, summarize_policy
    from producers.scheduler import seed_tasks
    from schemas.config import RunConfig

    torch.manual_seed(args.seed)
    cfg = RunConfig()
    if args.labels == "outcome":
        cfg = msgspec.structs.replace(cfg, signals=msgspec.structs.replace(cfg.signals, lam=0.0))
    pm, lcfg, scfg = cfg.policy_model, cfg.policy_learner, cfg.signals
    n, m, domain = cfg.scheduler.rollouts_per_task, cfg.judge.m, cfg.scheduler.domain
    workdir = ROOT / ".work" / "bench-policy-update"
    env = get_environment(domain)
    backend = load_backend(pm, role="policy", workdir=workdir)
    model, _ = load_trainable(pm, role="policy", workdir=workdir)
    model.eval()  # no dropout: behaviour, proximal and current logprobs must agree
    trainer = Trainer(build_engine(model, lcfg), lcfg, pm.temperature,
                      reference_weights(pm, lcfg, role="policy", workdir=workdir))  # fmt: skip

    def heldout() -> dict:
        if args.heldout <= 0:
            return {}
        result = evaluate_policy(backend, domain, [args.level], args.heldout, temperatures={"sampled": pm.temperature},
                                 max_tokens=pm.max_new_tokens, max_steps=cfg.actor.max_steps, seed=7)  # fmt: skip
        return result["sampled"][str(args.level)]

    started = time.perf_counter()
    before = heldout()
    print("held-out before", json.dumps(before), flush=True)
    snapshots = [{k: v.clone() for k, v in model.state_dict().items()}]  # weights per version, newest last
    tasks = seed_tasks(env, args.tasks, args.level, random.Random(args.seed))
    rows, step, newest = [], 0, 0
    for it in range(args.iters):
        t0 = time.perf_counter()
        if args.fresh and it > 0:
            tasks = seed_tasks(env, args.tasks, args.level, random.Random(args.seed * 1000 + it))
        played = play_tasks(backend, env, [t for t in tasks for _ in range(n)], temperature=pm.temperature,
                            max_tokens=pm.max_new_tokens, max_steps=cfg.actor.max_steps, seed=1000 * it)  # fmt: skip
        samples, eligible = [], 0
        for g in range(len(tasks)):
            group = played[g * n : (g + 1) * n]
            verdicts = [[[label_verdict(s.progress) if args.labels == "oracle" else 0] * m for s in e.steps]
                        for e in group]  # fmt: skip
            signals = group_signals([e.outcome for e in group], verdicts, lam=scfg.lam,
                                    policy_acc_low=scfg.policy_acc_low, policy_acc_high=scfg.policy_acc_high,
                                    episode_weighting=scfg.episode_weighting)  # fmt: skip
            eligible += signals.policy_eligible
            for t in signals.policy:
                c = group[t.rollout].steps[t.step].completion
                samples.append(TrainSample(key=f"{it}-{g}-{t.rollout}-{t.step}", prompt_ids=list(c.prompt_token_ids),
                                           response_ids=list(c.token_ids), behaviour_logprobs=list(c.logprobs),
                                           version=c.version, advantage=t.advantage, group=f"{it}-{g}"))  # fmt: skip
        stats = []
        for batch in versions(samples, args.batch_samples):
            random.Random(step).shuffle(batch)
            for _, _, s in trainer.batch_steps(batch, first_step=step):
                step += 1
                stats.append(s)
            snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
            newest += 1
        behind = min(args.lag, len(snapshots) - 1)
        backend.model.load_state_dict(snapshots[-1 - behind])
        backend.version = newest - behind
        snapshots = snapshots[-(args.lag + 1) :]  # only what a lagging sampler can still need
        played_summary = summarize_policy(played)

        def mean(name: str, values: list = stats) -> float:
            return round(sum(getattr(s, name) for s in values) / len(values), 4) if values else 0.0

        rows.append({
            "iteration": it,
            **{k: round(played_summary[k], 4) for k in ("success", "ci_low", "ci_high", "invalid_rate", "mean_steps")},
            "groups_eligible": eligible,
            "samples": len(samples),
            "optimizer_steps": len(stats),
            "kl": mean("kl"), "ref_kl": mean("ref_kl"), "clip_fraction": mean("clip_fraction"),
            "is_weight_mean": mean("is_weight_mean"),
            "seconds": round(time.perf_counter() - t0, 1),
        })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    backend.model.load_state_dict(model.state_dict())  # held-out success of the learner's newest weights
    after = heldout()
    print("held-out after", json.dumps(after), flush=True)
    result = {
        "bench": "policy_update",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rollouts_per_task": n,
        "learner": {k: getattr(lcfg, k) for k in LEARNER_FIELDS},
        "heldout_before": before,
        "heldout_after": after,
        "iterations": rows,
        "seconds": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
