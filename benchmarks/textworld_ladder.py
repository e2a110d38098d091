"""A TextWorld ladder measured: the cooking games', or with --domain textworld-custom the custom games'.

Per rung: game generation time, walkthrough length, the success of a random valid policy (uniform over
the listed commands, 40 turns) and play speed.

Games are training-range tasks (envs.seeds), generated into the shared cache under FORGESTREAM_HOME
(a second run reuses them; generation time is averaged over the games this run generated). Writes
benchmarks/results/textworld_ladder.json (textworld_custom_ladder.json) and prints a markdown table
(README).

    python benchmarks/textworld_ladder.py [--domain textworld] [--games 6] [--plays 10]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=6, help="games per rung")
    parser.add_argument("--plays", type=int, default=10, help="random-valid episodes per game")
    parser.add_argument("--domain", choices=("textworld", "textworld-custom"), default="textworld")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.out = args.out or RESULTS / f"{args.domain.replace('-', '_')}_ladder.json"
    sys.path.insert(0, str(ROOT))
    from envs import get_environment
    from envs.seeds import training_rng
    from envs.textworld import games
    from pipeline.evaluation import wilson

    env = get_environment(args.domain)
    rng = random.Random(20261201)
    rows = []
    for level in range(env.levels):
        gen_s, lengths, wins, plays, steps, play_s = [], [], 0, 0, 0, 0.0
        for _ in range(args.games):
            task = env.sample_task(level, training_rng(rng))
            before = games.generated
            started = time.perf_counter()
            lengths.append(len(env.oracle(task)))
            if games.generated > before:
                gen_s.append(time.perf_counter() - started)
            for _ in range(args.plays):
                started = time.perf_counter()
                episode = env.reset(task)
                while not episode.done:
                    episode.step(f"\\boxed{{{rng.randrange(len(episode.view.commands))}}}")
                    steps += 1
                play_s += time.perf_counter() - started
                wins += episode.outcome == 1
                plays += 1
        low, high = wilson(wins, plays)
        rows.append({"level": level, "knobs": {k: v for k, v in env.sample_task(level, random.Random(0)).params.items()
                                               if k not in ("kind", "max_steps")},
                     "random_valid_success": wins / plays, "ci95": [low, high], "plays": plays,
                     "walkthrough_mean": statistics.fmean(lengths),
                     "generate_s_mean": statistics.fmean(gen_s) if gen_s else None,
                     "steps_per_s": steps / play_s if play_s else 0.0})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"machine": "2 cores, no GPU", "domain": args.domain, "games_per_rung": args.games,
              "plays_per_game": args.plays, "rungs": rows}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1))
    print("| level | knobs | walkthrough | random-valid success [95 % CI] | generate (s) | steps / s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        k = r["knobs"]
        if "quest_length" in k:
            knobs = f"rooms {k['world_size']}, objects {k['nb_objects']}, quest {k['quest_length']}"
        else:
            knobs = f"recipe {k['recipe']}, take {k['take']}, go {k['go']}" + "".join(
                f", {name}" for name in ("open", "cook", "cut", "drop") if k[name]
            )
        gen = "—" if r["generate_s_mean"] is None else f"{r['generate_s_mean']:.1f}"
        print(f"| {r['level']} | {knobs} | {r['walkthrough_mean']:.1f} | {r['random_valid_success']:.2f} "
              f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] | {gen} | {r['steps_per_s']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
