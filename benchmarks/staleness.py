"""How stale the trained policy samples are in a real run: the distribution of learner version − sample
version over the samples the policy learner kept, with actors that load a new version between the
turns of running episodes (`actor.swap_weights = every_turn`, the default) and with actors that
finish their episodes first (`between_episodes`). Goal: never above η, mean ≤ 1.5.

Each mode is one `forgestream up --ephemeral --minutes M` at the defaults (the evaluator off); the
distribution comes from the learner's `learner/policy/staleness_samples` metrics, folded into the
run's report (`staleness_samples`). Writes benchmarks/results/staleness.json.

    python benchmarks/staleness.py [--minutes 4]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODES = ("every_turn", "between_episodes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "staleness.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from schemas.config import RunConfig

    eta = RunConfig().off_policy.eta
    from benchmarks import child_env, run_up

    base = child_env(FORGESTREAM_EVALUATOR__ENABLED="false")
    rows = []
    for mode in MODES:
        workdir = run_up(
            f"bench-staleness-{mode}", args.minutes, base | {"FORGESTREAM_ACTOR__SWAP_WEIGHTS": mode}
        )
        summary = json.loads((workdir / "report" / "summary.json").read_text())
        hist = {int(k): v for k, v in summary.get("staleness_samples", {}).items()}
        total = sum(hist.values())
        rows.append({"swap_weights": mode, "histogram": hist, "samples": total,
                     "mean": sum(k * v for k, v in hist.items()) / total if total else None,
                     "max": max(hist) if hist else None, "policy_version": summary["policy_version"],
                     "samples_trained": summary["samples_trained"], "trajectories": summary["trajectories"]})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    result = {"machine": "2 cores, no GPU", "minutes": args.minutes, "eta": eta, "rows": rows,
              "goal": f"max <= eta ({eta}), mean <= 1.5"}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("| actors swap weights | samples | staleness mean | max | histogram | policy version | judged |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        mean = "—" if r["mean"] is None else f"{r['mean']:.2f}"
        print(f"| {r['swap_weights']} | {r['samples']} | {mean} | {r['max']} | {r['histogram']} | "
              f"{r['policy_version']} | {r['trajectories']} |")  # fmt: skip


if __name__ == "__main__":
    main()
