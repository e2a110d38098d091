"""Asynchronous (streaming) vs synchronous (lockstep) training, the same roles: trained policy samples / s.

Every stage is a stub that takes configured wall time without using this machine's cores, as
generation, judging and training would on devices of their own: actors answer a turn of their 8
episodes in `--gen-s`, a judge a trajectory in `--judge-s`, the learners sleep `--train-s` per sample.
By default the three stages are near balance at ~4 policy samples / s each (an actor turns 8 episodes
in 2 s; 2 judges at 6 s per trajectory judge 4 / s when a trajectory holds 12 samples; 0.25 s per sample,
one pass), the case where lockstep loses most. A version is `--groups-per-version` groups (a batch per
group, `policy_learner.publish_every` batches per version; the paper's step is 16 tasks x 8 rollouts).
The bound is the slowest stage's rate, judging's computed from the run's own samples per judged
trajectory (episodes' lengths vary).

- lockstep: staleness bound η = 0 (scheduler and learner): the scheduler admits one version's requests,
  they are generated and judged, the learner trains them and publishes, and only then is the next
  version's work admitted (the paper's released code: generate all, judge all, train, publish; here
  the learner already trains a version's first groups while its last ones are generated);
- streaming: the defaults (η = 2): generation and judging of later versions run while the learner trains.

At most (η + 1) versions' groups are in flight (the staleness gate), so the version's size sets how
deep the stream is. A group is in flight from its request until its version is published: the longest
of its episodes (up to 40 turns of `--gen-s`), its last judgement, and its training. At one group per
version three groups in flight covered about 0.56 of the bound (η 4: 0.75). With 8 groups per version
(and `scheduler.max_concurrent_requests` lifted so that the gate alone bounds them) 24 may be in flight,
and the gate stays full of requests the actor has not reached yet.

Both are one `forgestream up --ephemeral --minutes M --without env-model` (the evaluator off, the task
pool fixed; every group trains, whatever its outcomes, so random stub answers make samples). Rates are
read from the run's metrics (`learner/policy/samples_trained`, `signals/policy_samples`) between the
learner's first and last reports of samples trained (one per optimizer step): neither start-up and the
pipeline's fill nor the drain after the stop counts, the learner's idle time between them does. A mode
needs at least three reports to be measured.
Writes benchmarks/results/async_vs_sync.json.

    python benchmarks/async_vs_sync.py [--minutes 16] [--gen-s 2.0] [--judge-s 6.0] [--train-s 0.25]
        [--groups-per-version 8] [--modes lockstep,streaming]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ACTORS, JUDGES = 1, 2  # what `up` starts by default (run_up passes no counts)


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


def rates(workdir: Path) -> dict[str, float]:
    """The run's steady rates, between the learner's first and last versions (so neither the pipeline's
    fill before the first version nor the drain after the stop counts; idle time between versions
    does): policy samples trained / s and produced by signals / s; and the run's totals, samples
    trained and produced."""
    trained = scalars(workdir, "learner/policy/samples_trained")
    produced = scalars(workdir, "signals/policy_samples")  # one report per group, value = its samples
    totals = {"samples_trained": int(trained[-1][1]) if trained else 0,
              "samples_produced": sum(v for _, v in produced)}  # fmt: skip
    if len(trained) < 3:  # fewer than two versions after the first: no steady span to measure
        return {"trained_per_s": 0.0, "produced_per_s": 0.0, "span_s": 0.0, **totals}
    (t0, n0), (t1, n1) = trained[0], trained[-1]
    span = t1 - t0
    made = sum(v for t, v in produced if t0 < t <= t1)
    return {"trained_per_s": (n1 - n0) / span, "produced_per_s": made / span, "span_s": span, **totals}


def stage_rates(
    args: argparse.Namespace, samples_per_trajectory: float, parallel_episodes: int
) -> dict[str, float]:
    """Each stage's rate in policy samples / s when it is never starved: the actor plays
    `parallel_episodes` turns per `gen_s`, each judge a trajectory per `judge_s`, the learner a sample
    per `train_s`. The slowest of the three bounds any schedule."""
    return {
        "generation": ACTORS * parallel_episodes / args.gen_s,
        "judging": JUDGES * samples_per_trajectory / args.judge_s,
        "training": 1.0 / args.train_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=16.0)  # lockstep needs 2 versions or more
    parser.add_argument("--gen-s", type=float, default=2.0, help="an actor's turn of 8 episodes")
    parser.add_argument("--judge-s", type=float, default=6.0, help="a judge's verdicts on one trajectory")
    parser.add_argument("--train-s", type=float, default=0.25, help="the policy learner's time per sample")
    parser.add_argument("--groups-per-version", type=int, default=8, help="groups a policy version trains")
    parser.add_argument("--modes", default="lockstep,streaming", help="which of lockstep, streaming to run")
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
        # a batch per group, a version per `groups_per_version` batches, one pass: the learner's bound is
        # 1 / train-s, and in lockstep (η = 0) the scheduler admits a version's groups, waits for the
        # version, admits the next version's
        FORGESTREAM_POLICY_LEARNER__BATCH_SAMPLES="1",
        FORGESTREAM_POLICY_LEARNER__PUBLISH_EVERY=str(args.groups_per_version),
        FORGESTREAM_POLICY_LEARNER__EPOCHS="1",
        FORGESTREAM_REWARD_LEARNER__ENGINE="stub",
        FORGESTREAM_REWARD_LEARNER__STUB_SAMPLE_S=str(args.train_s / 10),  # never the bottleneck
        FORGESTREAM_SIGNALS__POLICY_ACC_LOW="0",  # random answers rarely mix outcomes: train every group
        FORGESTREAM_SIGNALS__POLICY_ACC_HIGH="1",
        FORGESTREAM_SCHEDULER__SEED_DIFFICULTY="1",
        # only the staleness gate bounds the groups in flight: at the default 8 a group still counts as
        # running while it waits for its judges, and 8 running groups left the actor's slots idle
        FORGESTREAM_SCHEDULER__MAX_CONCURRENT_REQUESTS="64",
        # a partial batch trains after 1 s idle in both modes (the default 45 s would stall lockstep)
        FORGESTREAM_POLICY_LEARNER__BATCH_WAIT_S="1",
        FORGESTREAM_REWARD_LEARNER__BATCH_WAIT_S="1",
    )
    modes = {
        "lockstep": {"FORGESTREAM_OFF_POLICY__ETA": "0", "FORGESTREAM_REWARD_LEARNER__ETA": "0"},
        "streaming": {},
    }  # fmt: skip
    picked = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not picked or set(picked) - set(modes):
        parser.error(f"--modes: a comma-separated choice of {', '.join(modes)}, got {args.modes!r}")
    modes = {m: modes[m] for m in modes if m in picked}
    from schemas.config import RunConfig

    parallel_episodes = RunConfig().actor.parallel_episodes
    rows = []
    for mode, extra in modes.items():
        # the task pool stays as seeded: random stub play wins most level-1 tasks, and the env model's
        # harder variants lengthened the episodes during a run, so the work in flight grew and the rate
        # between the learner's reports fell short of what the stages did
        workdir = run_up(f"bench-async-{mode}", args.minutes, stubs | extra, "--without", "env-model")
        measured = rates(workdir)
        summary = json.loads((workdir / "report" / "summary.json").read_text())
        per_trajectory = measured["samples_produced"] / max(1, summary["trajectories"])
        stages = stage_rates(args, per_trajectory, parallel_episodes)
        bound = min(stages.values())
        rows.append({"mode": mode, "samples_per_s": measured["trained_per_s"],
                     "of_bound": measured["trained_per_s"] / bound, "bound_samples_per_s": bound,
                     "slowest_stage": min(stages, key=stages.__getitem__), "stage_rates": stages,
                     "samples_per_trajectory": per_trajectory, "produced_per_s": measured["produced_per_s"],
                     "samples_trained": measured["samples_trained"], "steady_span_s": measured["span_s"],
                     "policy_version": summary["policy_version"], "trajectories": summary["trajectories"],
                     "staleness_mean": summary["staleness_mean"]})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    by_mode = {r["mode"]: r for r in rows}
    lockstep, streaming = by_mode.get("lockstep"), by_mode.get("streaming")
    result = {
        "machine": "2 cores, no GPU; stub stages use no CPU",
        "minutes": args.minutes,
        "stage_seconds": {
            "generation_turn": args.gen_s,
            "judge_trajectory": args.judge_s,
            "train_sample": args.train_s,
        },  # fmt: skip
        "groups_per_version": args.groups_per_version,
        "rates": "policy samples trained / s between the learner's first and last versions; the bound is "
        "the slowest stage's rate (stage_rates), judging's from the run's samples per judged trajectory",
        "rows": rows,
        "streaming_over_lockstep": streaming["samples_per_s"] / lockstep["samples_per_s"]
        if lockstep and streaming and lockstep["samples_per_s"]
        else None,
        "goal": "streaming >= 0.95 of the bound (the slowest stage's rate)",
        "command": "python benchmarks/async_vs_sync.py " + " ".join(sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("| mode | trained samples / s | bound (slowest stage) | of the bound | produced / s | versions | "
          "judged | staleness mean |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['samples_per_s']:.2f} | {r['bound_samples_per_s']:.2f} ({r['slowest_stage']}) | "
              f"{r['of_bound']:.2f} | {r['produced_per_s']:.2f} | {r['policy_version']} | "
              f"{r['trajectories']} | {r['staleness_mean']} |")  # fmt: skip
    ratio = result["streaming_over_lockstep"]
    if len(rows) == 2:
        print(f"streaming / lockstep: {ratio:.2f}" if ratio else "lockstep trained nothing")


if __name__ == "__main__":
    main()
