"""Asynchronous (streaming) vs synchronous (lockstep) training, the same roles: trained policy samples / s.

Every stage is a stub that takes configured wall time without using this machine's cores, as
generation, judging and training would on devices of their own: actors answer a turn of their 8
episodes in `--gen-s`, a judge a trajectory in `--judge-s`, the learners sleep `--train-s` per sample.
By default the three stages are balanced at ~4 policy samples / s each (an actor turns 8 episodes in
2 s; a trajectory of ~12 samples is judged in 6 s by each of 2 judges; 0.25 s per sample, a version per
group, one pass), the case where lockstep loses most; the bound is the learner's rate, 1 / train-s.
The table also shows the rate at which policy samples were produced.

- lockstep: staleness bound η = 0 (scheduler and learner): the scheduler admits one version's requests,
  they are generated and judged, the learner trains them and publishes, and only then is the next
  version's work admitted (the paper's released code: generate all, judge all, train, publish);
- streaming: the defaults (η = 2): generation and judging of later versions run while the learner trains.

Both are one `forgestream up --ephemeral --minutes M` (the evaluator off; every group trains, whatever
its outcomes, so random stub answers make samples). Rates are read from the run's metrics
(`learner/policy/samples_trained`, `signals/policy_samples`) from the first group produced to the
learner's last report (start-up excluded).
Writes benchmarks/results/async_vs_sync.json.

    python benchmarks/async_vs_sync.py [--minutes 5] [--gen-s 2.0] [--judge-s 6.0] [--train-s 0.25]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def scalars(workdir: Path, tag: str) -> list[tuple[float, float]]:
    """(wall time, value) of every report of `tag` in the run's TensorBoard files, in time order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points = []
    for events in sorted((workdir / "tensorboard").glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            points += [(e.wall_time, e.value) for e in acc.Scalars(tag)]
    return sorted(points)


def rates(workdir: Path) -> tuple[float, float, int]:
    """(policy samples trained / s, policy samples the signals role produced / s, samples trained), both
    over the same span: from the first group signals produced (the pipeline had work; start-up excluded)
    to the learner's last report."""
    trained = scalars(workdir, "learner/policy/samples_trained")
    produced = scalars(workdir, "signals/policy_samples")  # one report per group, value = its samples
    if not trained or not produced:
        return 0.0, 0.0, int(trained[-1][1]) if trained else 0
    start, end = produced[0][0], trained[-1][0]
    span = max(end - start, 1e-9)
    return trained[-1][1] / span, sum(v for t, v in produced if t <= end) / span, int(trained[-1][1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--gen-s", type=float, default=2.0, help="an actor's turn of 8 episodes")
    parser.add_argument("--judge-s", type=float, default=6.0, help="a judge's verdicts on one trajectory")
    parser.add_argument("--train-s", type=float, default=0.25, help="the policy learner's time per sample")
    parser.add_argument("--out", type=Path, default=RESULTS / "async_vs_sync.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks import child_env, run_up

    stubs = child_env(
        FORGESTREAM_EVALUATOR__ENABLED="false",
        FORGESTREAM_POLICY_MODEL__BACKEND="stub",
        FORGESTREAM_POLICY_MODEL__STUB_STEP_S=str(args.gen_s),
        FORGESTREAM_REWARD_MODEL__BACKEND="stub",
        FORGESTREAM_REWARD_MODEL__STUB_STEP_S=str(args.judge_s),
        FORGESTREAM_POLICY_LEARNER__ENGINE="stub",
        FORGESTREAM_POLICY_LEARNER__STUB_SAMPLE_S=str(args.train_s),
        # a version per group, one pass: the learner's bound is 1 / train-s, and in lockstep (η = 0) the
        # scheduler admits one group, waits for its version, admits the next
        FORGESTREAM_SCHEDULER__GROUPS_PER_VERSION="1",
        FORGESTREAM_POLICY_LEARNER__BATCH_SAMPLES="1",
        FORGESTREAM_POLICY_LEARNER__EPOCHS="1",
        FORGESTREAM_REWARD_LEARNER__ENGINE="stub",
        FORGESTREAM_REWARD_LEARNER__STUB_SAMPLE_S=str(args.train_s / 10),  # never the bottleneck
        FORGESTREAM_SIGNALS__POLICY_ACC_LOW="0",  # random answers rarely mix outcomes: train every group
        FORGESTREAM_SIGNALS__POLICY_ACC_HIGH="1",
        FORGESTREAM_SCHEDULER__SEED_DIFFICULTY="1",
        # a partial batch trains after 1 s idle in both modes (the default 45 s would stall lockstep)
        FORGESTREAM_POLICY_LEARNER__BATCH_WAIT_S="1",
        FORGESTREAM_REWARD_LEARNER__BATCH_WAIT_S="1",
    )
    modes = {
        "lockstep": {"FORGESTREAM_OFF_POLICY__ETA": "0", "FORGESTREAM_REWARD_LEARNER__ETA": "0"},
        "streaming": {},
    }  # fmt: skip
    bound = 1.0 / args.train_s
    rows = []
    for mode, extra in modes.items():
        workdir = run_up(f"bench-async-{mode}", args.minutes, stubs | extra)
        rate, produced, trained = rates(workdir)
        summary = json.loads((workdir / "report" / "summary.json").read_text())
        rows.append({"mode": mode, "samples_per_s": rate, "of_bound": rate / bound, "samples_trained": trained,
                     "produced_per_s": produced,
                     "policy_version": summary["policy_version"], "trajectories": summary["trajectories"],
                     "staleness_mean": summary["staleness_mean"]})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    lockstep, streaming = rows
    result = {
        "machine": "2 cores, no GPU; stub stages use no CPU",
        "minutes": args.minutes,
        "stage_seconds": {
            "generation_turn": args.gen_s,
            "judge_trajectory": args.judge_s,
            "train_sample": args.train_s,
        },  # fmt: skip
        "bound_samples_per_s": bound,
        "rows": rows,
        "streaming_over_lockstep": streaming["samples_per_s"] / lockstep["samples_per_s"]
        if lockstep["samples_per_s"]
        else None,
        "goal": "streaming >= 0.95 of the bound (the slowest stage's rate)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("| mode | trained samples / s | of the bound | produced / s | versions | judged | staleness mean |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['samples_per_s']:.2f} | {r['of_bound']:.2f} | {r['produced_per_s']:.2f} | "
              f"{r['policy_version']} | "
              f"{r['trajectories']} | {r['staleness_mean']} |")  # fmt: skip
    ratio = result["streaming_over_lockstep"]
    print(f"streaming / lockstep: {ratio:.2f}" if ratio else "lockstep trained nothing")


if __name__ == "__main__":
    main()
