"""The default presets on their training band: what `make run` starts from.

The policy preset plays held-out tasks of the default band (`scheduler.seed_difficulty`) once, sampled
as the actors play; the reward preset judges those episodes' steps (greedy, one verdict each). Goals:
- policy success in [0.2, 0.6]: groups of mixed outcomes, so the policy has something to learn;
- policy invalid turns ≤ 0.1: failures are planning failures, not format (not met by today's preset);
- reward balanced accuracy ≥ 0.62 on those steps, and it says "good" within 0.15 of the labels' rate.

    python benchmarks/presets.py [--tasks 40]
Builds the presets first if they are not cached (`forgestream prepare`, over an hour here).
Writes benchmarks/results/presets.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--out", type=Path, default=RESULTS / "presets.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import learners.tiny_preset  # noqa: F401  (registers the tiny recipe, as the CLI does)
    from infra.models import load_backend, prepare_run_models
    from pipeline.evaluation import play_heldout, process_accuracy, summarize_policy
    from schemas.config import RunConfig

    run = RunConfig()
    workdir = ROOT / ".work" / "bench-presets"
    start = time.monotonic()
    folders = prepare_run_models(run, workdir)
    policy = load_backend(run.policy_model, role="policy", workdir=workdir)
    episodes = play_heldout(policy, run.scheduler.domain, run.scheduler.seed_difficulty, args.tasks,
                            temperature=run.policy_model.temperature, max_tokens=run.policy_model.max_new_tokens)  # fmt: skip
    played = summarize_policy(episodes)
    judge = load_backend(run.reward_model, role="reward", workdir=workdir)
    steps = [s for e in episodes for s in e.steps]
    judged = process_accuracy(judge, steps, m=1, temperature=0.0, max_tokens=run.judge.max_new_tokens)
    goals = {
        "policy_success_in_0.2_0.6": 0.2 <= played["success"] <= 0.6,
        "policy_invalid_rate_at_most_0.1": played["invalid_rate"] <= 0.1,
        "reward_balanced_accuracy_at_least_0.62": judged["balanced_accuracy"] >= 0.62 and judged["unparseable"] == 0.0,
        "reward_says_good_within_0.15_of_labels": abs(judged["said_good"] - judged["good_label_rate"]) <= 0.15,
    }  # fmt: skip
    result = {
        "domain": run.scheduler.domain,
        "level": run.scheduler.seed_difficulty,
        "tasks": args.tasks,
        "policy_preset": folders["policy"].name,
        "reward_preset": folders["reward"].name,
        "policy": played,
        "reward": judged,
        "goals_met": goals,
        "seconds": round(time.monotonic() - start, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
