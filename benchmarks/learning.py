"""The paper's Table 1 at small scale: which part of the closed loop helps, on held-out tasks.

Rows (household, `tiny` preset, the same wall-clock budget per run):
- Before   the preset itself;
- RLVR     λ = 0 (outcome only), reward model frozen (no reward learner), environment static (no env model);
- Policy   integrated reward R = O + λ·mean S, reward model frozen, environment static;
- Shadow   (not in the default rows) as +Reward, but the judges stay on the preset (judge.follow_weights
           off): the reward learner's share of the CPU without its effect on the rewards, i.e. Policy at
           +Reward's compute;
- +Reward  the reward model co-trained;
- PaperRM  (not in the default rows) as +Reward, with the paper's one λ for the reward model's consistency
           reward too (signals.rm_lam 1; the default 3.5 lets its verdicts' 2-1 majority outvote the outcome);
- +Env     the full loop (env model proposes variants, forge accepts them).
Each run is `forgestream up --ephemeral --minutes M` (its own seed), then `forgestream eval` of its
newest policy on held-out tasks of the training band (scheduler.seed_difficulty) and of a band two
levels harder (or the hardest) that nothing trained on; rows that train the reward model also get its
process accuracy, measured on the preset policy's held-out steps (the steps Before's reward model is
judged on).
Writes benchmarks/results/learning.json, learning.png and a markdown table (README).

    python benchmarks/learning.py [--minutes 6] [--seeds 3] [--tasks 200] [--resume]

Each row is also paired with Before task by task (the held-out tasks are fixed; `solved` strings,
McNemar's exact test over the seeds' pairs). A stopped bench keeps its finished runs in --out;
--resume runs only the rows and seeds it lacks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ROWS: dict[str, dict] = {
    "RLVR": {"without": ["reward-learner", "env-model"], "env": {"FORGESTREAM_SIGNALS__LAM": "0"}},
    "Policy": {"without": ["reward-learner", "env-model"], "env": {}},
    "Shadow": {"without": ["env-model"], "env": {"FORGESTREAM_JUDGE__FOLLOW_WEIGHTS": "false"}},
    "+Reward": {"without": ["env-model"], "env": {}},
    "PaperRM": {"without": ["env-model"], "env": {"FORGESTREAM_SIGNALS__RM_LAM": "1"}},
    "+Env": {"without": [], "env": {}},
}

EXPERIMENT_ROWS = ("Shadow", "PaperRM")  # run on request (--rows), not in the Table 1 replicate


def cli(*args: str, env: dict[str, str], log: Path) -> None:
    with open(log, "ab") as out:
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, stdout=out, stderr=out
        )
    if done.returncode != 0:
        raise RuntimeError(f"forgestream {' '.join(args)} failed ({done.returncode}); see {log}")


def evaluate(workdir: Path, policy: str, levels: str, tasks: int, seed: int, env: dict[str, str],
             reward_model: str | None = None, modes: str = "sampled") -> dict:  # fmt: skip
    out = workdir / f"eval-{policy}-rm-{reward_model or 'none'}.json"
    args = ["eval", "--policy", policy, "--levels", levels, "--tasks", str(tasks), "--modes", modes,
            "--seed", str(seed), "--json", str(out), "--workdir", str(workdir)]  # fmt: skip
    if reward_model:
        args += ["--reward-model", reward_model]
    cli(*args, env=env, log=workdir / "eval.log")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=6.0, help="wall-clock budget of each run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=200, help="held-out tasks per level (40: ± 0.15)")
    parser.add_argument("--rows", default=",".join(r for r in ROWS if r not in EXPERIMENT_ROWS),
                        help=f"comma-separated rows out of {', '.join(ROWS)}")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS / "learning.json")
    parser.add_argument("--resume", action="store_true", help="keep --out's finished runs, run the rest")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from schemas.config import RunConfig

    band = RunConfig().scheduler.seed_difficulty
    levels = f"{band},{harder_than(band)}"
    from benchmarks import child_env

    base_env = child_env(FORGESTREAM_EVALUATOR__ENABLED="false")
    base = ROOT / ".work" / "bench-learning"
    runs, spent = finished_runs(args, band) if args.resume else ([], 0.0)
    done = {(r["row"], r["seed"]) for r in runs}
    started = time.time() - spent
    for seed in range(args.seeds):
        env = base_env | {"FORGESTREAM_SEED": str(seed)}
        if ("Before", seed) not in done:
            before_dir = base / f"before-s{seed}"
            before_dir.mkdir(parents=True, exist_ok=True)
            result = evaluate(before_dir, "preset", levels, args.tasks, seed, env, reward_model="preset")
            runs.append({"row": "Before", "seed": seed, "eval": result})
        for row in [r.strip() for r in args.rows.split(",") if r.strip()]:
            if (row, seed) in done:
                continue
            spec = ROWS[row]
            workdir = base / f"{row.strip('+').lower()}-s{seed}"
            if workdir.exists():
                subprocess.run(["rm", "-rf", str(workdir)], check=True)
            workdir.mkdir(parents=True)
            run_env = env | spec["env"]
            without = [a for role in spec["without"] for a in ("--without", role)]
            t0 = time.time()
            cli("up", "--ephemeral", "--no-live", "--minutes", str(args.minutes), "--workdir", str(workdir),
                *without, env=run_env, log=workdir / "up.log")  # fmt: skip
            summary = workdir / "report" / "summary.json"  # up's last snapshot of the run
            snapshot = json.loads(summary.read_text()) if summary.is_file() else {}
            result = evaluate(workdir, "latest", levels, args.tasks, seed, run_env)
            record = {"row": row, "seed": seed, "eval": result, "run_s": time.time() - t0, "status": snapshot}
            if "reward-learner" not in spec["without"]:
                # on the preset policy's held-out steps, the very steps Before's reward model is judged on:
                # a run's own policy would change the steps along with the judge
                record["reward_eval"] = evaluate(workdir, "preset", levels, args.tasks, seed, run_env,
                                                 reward_model="latest", modes="none")  # fmt: skip
            runs.append(record)
            print(
                f"{row} seed {seed}: {summarize_run(result, band, record.get('reward_eval'))}",
                flush=True,
            )
            write(args, runs, band, started, complete=False)  # a stopped bench keeps its finished runs
    table = write(args, runs, band, started, complete=True)
    plot(table, band, args.out.with_suffix(".png"))
    print(markdown(table, band, args.minutes, args.seeds))


def finished_runs(args: argparse.Namespace, band: int) -> tuple[list[dict], float]:
    """The runs a stopped bench left in --out and the wall time it spent, if it measured the same thing."""
    if not args.out.is_file():
        return [], 0.0
    old = json.loads(args.out.read_text())
    for field, want in (("minutes_per_run", args.minutes), ("tasks_per_level", args.tasks), ("band", band)):
        if old.get(field) != want:
            raise SystemExit(f"--resume: {args.out} has {field} = {old.get(field)}, this bench {want}")
    return old["runs"], old.get("wall_s", 0.0)


def harder_than(band: int) -> int:
    """The held-out level nothing trains on: two above the band, or the hardest there is."""
    from envs import get_environment
    from schemas.config import RunConfig

    return min(band + 2, get_environment(RunConfig().scheduler.domain).levels - 1)


def write(args: argparse.Namespace, runs: list[dict], band: int, started: float, *, complete: bool) -> dict:
    table = aggregate(runs, band)
    out = {"machine": "2 cores, no GPU", "minutes_per_run": args.minutes, "seeds": args.seeds,
           "tasks_per_level": args.tasks, "band": band, "harder": harder_than(band), "complete": complete,
           "table": table, "runs": runs, "wall_s": time.time() - started}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return table


def summarize_run(result: dict, band: int, reward_eval: dict | None = None) -> dict:
    """The run's held-out success per level; process accuracy from its reward evaluation (on the
    preset policy's steps) or, for Before, from its own."""
    by_level = result["policy_results"]["sampled"]
    out = {f"level {lv}": round(r["success"], 3) for lv, r in by_level.items()}
    judged = (reward_eval or result).get("process_accuracy")
    if judged:
        out["process_accuracy"] = round(judged.get("accuracy", 0.0), 3)
    return out


def aggregate(runs: list[dict], band: int) -> dict[str, dict]:
    """Per row: mean and spread over seeds of held-out success per band, pooled successes / tasks,
    the pairing with Before on the same tasks, process accuracy, accepted variants."""
    from pipeline.evaluation import wilson

    table: dict[str, dict] = {}
    for row in dict.fromkeys(r["row"] for r in runs):
        mine = [r for r in runs if r["row"] == row]
        entry: dict = {"seeds": len(mine)}
        for name, level in (("band", band), ("harder", harder_than(band))):
            results = [r["eval"]["policy_results"]["sampled"][str(level)] for r in mine]
            rates = [x["success"] for x in results]
            wins, n = sum(x["successes"] for x in results), sum(x["tasks"] for x in results)
            entry[name] = {"mean": statistics.fmean(rates), "sd": statistics.pstdev(rates), "pooled": wins / n,
                           "ci95": wilson(wins, n), "invalid": statistics.fmean(x["invalid_rate"] for x in results)}  # fmt: skip
            if row != "Before":
                entry[name]["vs_before"] = _paired_with_before(runs, mine, level)
        judged = [
            pa
            for r in mine
            if (pa := r.get("reward_eval", r["eval"]).get("process_accuracy", {})).get("steps")
        ]
        entry["process_accuracy"] = statistics.fmean(pa["accuracy"] for pa in judged) if judged else None
        entry["process_accuracy_balanced"] = (
            statistics.fmean(pa["balanced_accuracy"] for pa in judged) if judged else None
        )
        accepted = [r.get("status", {}).get("variants_accepted") for r in mine if r.get("status")]
        entry["variants_accepted"] = statistics.fmean(accepted) if accepted else None
        table[row] = entry
    return table


def _paired_with_before(runs: list[dict], mine: list[dict], level: int) -> dict | None:
    """One McNemar test over every seed's pairs (this row's run against Before at that seed, task by
    task); None where no seed has both `solved` strings (results from before they were recorded)."""
    from pipeline.evaluation import paired_comparison

    before = {r["seed"]: r for r in runs if r["row"] == "Before"}
    a = b = ""
    for run in mine:
        if run["seed"] not in before:
            continue
        mine_solved = run["eval"]["policy_results"]["sampled"][str(level)].get("solved")
        their_solved = before[run["seed"]]["eval"]["policy_results"]["sampled"][str(level)].get("solved")
        if mine_solved is not None and their_solved is not None:
            a, b = a + their_solved, b + mine_solved
    return paired_comparison(a, b) if a else None


def markdown(table: dict[str, dict], band: int, minutes: float, seeds: int) -> str:
    lines = [f"| row | held-out success, level {band} (trained) | level {harder_than(band)} (harder) | invalid | "
             "paired with Before: Δ (p) | process accuracy (balanced) | variants accepted |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for row, e in table.items():
        pa = (
            "—"
            if e["process_accuracy"] is None
            else (f"{e['process_accuracy']:.2f} ({e.get('process_accuracy_balanced') or 0:.2f})")
        )
        va = "—" if e["variants_accepted"] is None else f"{e['variants_accepted']:.1f}"
        b, h = e["band"], e["harder"]
        paired = (
            "—"
            if not (d := b.get("vs_before"))
            else f"{d['difference']:+.3f} ({d['p_value']:.2g}, {d['items']} pairs)"
        )
        lines.append(f"| {row} | {b['mean']:.2f} ± {b['sd']:.2f} [{b['ci95'][0]:.2f}, {b['ci95'][1]:.2f}] | "
                     f"{h['mean']:.2f} ± {h['sd']:.2f} | {b['invalid']:.2f} | {paired} | {pa} | {va} |")  # fmt: skip
    lines.append(
        f"\n{minutes:g} min per run, {seeds} seeds; mean ± sd over seeds, [95 % Wilson interval of the pooled tasks]."
    )
    return "\n".join(lines)


def plot(table: dict[str, dict], band: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(table)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for offset, (name, label) in enumerate(
        (("band", f"level {band} (trained)"), ("harder", f"level {harder_than(band)}"))
    ):
        xs = [i + (offset - 0.5) * 0.38 for i in range(len(rows))]
        ax.bar(xs, [table[r][name]["mean"] for r in rows], width=0.36, yerr=[table[r][name]["sd"] for r in rows],
               label=label, capsize=3)  # fmt: skip
    ax.set_xticks(range(len(rows)), rows)
    ax.set_ylabel("held-out success")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
