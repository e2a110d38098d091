"""Progress folding (the status figures) and the HTML/PNG report, on hand-built events."""

from __future__ import annotations

import json

import msgspec

from app.progress import Progress
from app.report import write_report
from schemas import events as ev
from schemas import topics as tp

SHA = "0" * 64


def _task(task_id: str, status: str = "active", difficulty: int = 0) -> ev.TaskSpec:
    return ev.TaskSpec(
        task_id=task_id, domain="arith", difficulty=difficulty, params={}, seed=1, status=status
    )


def _judged(request_id: str, rollout: int, outcome: int, verdicts: list[int]) -> ev.JudgedTrajectory:
    step = ev.Step(
        index=0,
        prompt="p",
        response="r",
        prompt_token_ids=[1],
        response_token_ids=[2],
        behaviour_logprobs=[-0.5],
        policy_version=0,
    )
    traj = ev.Trajectory(
        request_id=request_id,
        rollout_index=rollout,
        group_size=2,
        task=_task("t0"),
        steps=[step],
        outcome=outcome,
    )
    judgements = [
        ev.Judgement(verdict=v, prompt_token_ids=[1], response_token_ids=[2], behaviour_logprobs=[-0.1])
        for v in verdicts
    ]
    return ev.JudgedTrajectory(
        trajectory=traj, steps=[ev.StepJudgement(step_index=0, judgements=judgements)], reward_version=0
    )


def test_progress_counts_effects_not_deliveries_and_derives_every_status_key():
    p = Progress()
    p.apply(tp.WEIGHTS, ev.WeightsPublished(model="policy", version=3, uri="x", sha256=SHA, bytes=1), 10.0)
    p.apply(tp.WEIGHTS, ev.WeightsPublished(model="policy", version=2, uri="x", sha256=SHA, bytes=1), 11.0)
    p.apply(tp.WEIGHTS, ev.WeightsPublished(model="reward", version=1, uri="x", sha256=SHA, bytes=1), 11.0)
    p.apply(tp.TASKS, _task("a"), 12.0)
    p.apply(tp.TASKS, _task("b", "pending", 1), 12.0)
    p.apply(tp.TASKS, _task("b", "active", 1), 13.0)  # the same key again: last value wins
    p.apply(tp.TASKS, _task("c", "pending", 2), 13.0)
    good = _judged("r1", 0, 1, [1, 1, -1])
    p.apply(tp.JUDGED, good, 14.0)
    p.apply(tp.JUDGED, good, 14.5)  # redelivered duplicate
    p.apply(tp.JUDGED, _judged("r1", 1, -1, [-1, 0, 1]), 15.0)
    p.apply(
        tp.TASK_EVENTS,
        ev.TaskEvent(event_id="e1", task_id="b", task_version=1, kind="accepted", accuracy=0.5, rollouts=8),
        16.0,
    )
    p.apply(
        tp.TASK_EVENTS,
        ev.TaskEvent(event_id="e2", task_id="d", task_version=1, kind="rejected", accuracy=0.0, rollouts=8),
        16.0,
    )
    p.apply(
        tp.METRICS, ev.Metric(role="policy-learner", name="learner/policy/samples_trained", value=40), 17.0
    )
    p.apply(
        tp.METRICS, ev.Metric(role="policy-learner", name="learner/policy/samples_trained", value=64), 18.0
    )
    p.apply(tp.METRICS, ev.Metric(role="policy-learner", name="staleness", value=1), 18.0)
    p.apply(tp.METRICS, ev.Metric(role="policy-learner", name="staleness", value=2), 18.0)
    for lag, count in (("0", 5.0), ("2", 3.0), ("0", 1.0)):
        p.apply(tp.METRICS, ev.Metric(role="policy-learner", name="learner/policy/staleness_samples", value=count,
                                      labels={"versions": lag}), 18.0)  # fmt: skip
    p.apply(
        tp.DLQ,
        ev.DeadLetter(source_topic="x", partition=0, offset=1, key=None, value=b"?", error="bad"),
        19.0,
    )

    snap = p.snapshot(lag={"actors": 3})
    assert snap["policy_version"] == 3 and snap["reward_version"] == 1
    assert snap["trajectories"] == 2
    assert snap["success_rate"] == 0.5
    assert snap["tasks_active"] == 2 and snap["tasks_pending"] == 1
    assert snap["variants_accepted"] == 1 and snap["variants_rejected"] == 1
    assert snap["samples_trained"] == 64
    assert snap["staleness_mean"] == 1.5
    assert snap["staleness_samples"] == {"0": 6, "2": 3}
    # verdicts with the outcome's sign: rollout 0 (+1): 1,1 agree, -1 not; rollout 1 (-1): -1 agrees, 1 not, 0 skipped
    assert snap["verdict_agreement"] == round(3 / 5, 4)
    assert snap["dlq"] == 1 and snap["lag"] == {"actors": 3}
    assert p.difficulty_spread() == {0: 1, 1: 1}
    assert p.success_by_version == {0: {0: [1, 2]}}  # both rollouts started at v0 on level 0, one won
    harder = _judged("r2", 0, 1, [1])
    harder = msgspec.structs.replace(
        harder, trajectory=msgspec.structs.replace(harder.trajectory, task=_task("t9", difficulty=3))
    )
    p.apply(tp.JUDGED, harder, 20.0)
    assert p.success_by_version == {0: {0: [1, 2], 3: [1, 1]}}  # levels apart, not pooled


def test_progress_folds_evaluations_per_version():
    p = Progress()
    for version, level, value in ((0, "3", 0.25), (4, "3", 0.5), (4, "5", 0.125), (0, "3", 0.3)):
        metric = ev.Metric(
            role="evaluator", name="eval/policy/success", value=value, step=version, labels={"level": level}
        )
        p.apply(tp.METRICS, metric, 1.0)
    # with a mode label, sampled is the level's own curve
    for mode, value in (("sampled", 0.75), ("redraw", 0.875)):
        labels = {"level": "5", "mode": mode}
        metric = ev.Metric(role="evaluator", name="eval/policy/success", value=value, step=8, labels=labels)
        p.apply(tp.METRICS, metric, 1.0)
    p.apply(tp.METRICS, ev.Metric(role="evaluator", name="eval/reward/accuracy", value=0.6, step=2), 1.0)
    # a re-evaluated version: last wins
    assert p.heldout == {"3": {0: 0.3, 4: 0.5}, "5": {4: 0.125, 8: 0.75}, "5 redraw": {8: 0.875}}
    snap = p.snapshot()
    assert snap["heldout_success"] == {"3": {"version": 4, "value": 0.5}, "5": {"version": 8, "value": 0.75},
                                       "5 redraw": {"version": 8, "value": 0.875}}  # fmt: skip
    assert snap["process_accuracy"] == {"accuracy": {"version": 2, "value": 0.6}}


def test_board_tags_make_a_curve_per_process_level_and_mode_only():
    from app.up import board_tag

    def tag(**labels: str) -> str:
        return board_tag(ev.Metric(role="r", name="eval/policy/success", value=0.5, labels=labels))

    assert tag() == "eval/policy/success"
    assert tag(level="8", mode="redraw") == "eval/policy/success/8/redraw"
    assert tag(mode="sampled", level="9") == "eval/policy/success/9/sampled"  # CURVE_LABELS' order
    assert tag(process="judge", pid="41") == "eval/policy/success/judge"  # a restart stays on its curve
    assert tag(task="t1", reason="stale") == "eval/policy/success"  # one curve per task would be thousands


def test_progress_sums_cpu_over_a_roles_processes_and_restarts():
    """Each process reports cumulative CPU seconds: the last report of each pid counts (a late, smaller
    one changes nothing), copies and restarts (new pids) of a role add up; memory is the largest peak."""
    p = Progress()
    reports = (("judge", "11", 5.0, 900.0), ("judge", "12", 7.0, 1200.0), ("judge", "11", 9.5, 950.0),
               ("judge", "11", 8.0, 940.0), ("actor", "20", 3.0, 800.0), ("actor", "21", 1.25, 700.0))  # fmt: skip
    for process, pid, cpu, rss in reports:
        labels = {"process": process, "pid": pid}
        p.apply(tp.METRICS, ev.Metric(role=process, name="process/cpu_s", value=cpu, labels=labels), 1.0)
        p.apply(
            tp.METRICS, ev.Metric(role=process, name="process/rss_peak_mb", value=rss, labels=labels), 1.0
        )
    p.add_usage("broker:tansu", "30", cpu_s=2.0, rss_peak_mb=50.0)
    snap = p.snapshot()
    assert snap["cpu_s"] == {"actor": 4.2, "broker:tansu": 2.0, "judge": 16.5}  # 9.5 + 7; 3 + 1.25
    assert snap["rss_peak_mb"] == {"actor": 800, "broker:tansu": 50, "judge": 1200}


def test_report_writes_every_plot_and_a_page(tmp_path):
    p = Progress()
    for i in range(6):
        p.apply(
            tp.WEIGHTS,
            ev.WeightsPublished(model="policy", version=i, uri="x", sha256=SHA, bytes=1),
            100.0 + 30 * i,
        )
        p.apply(tp.JUDGED, _judged(f"r{i}", 0, 1 if i % 2 else -1, [1, -1, 1]), 101.0 + 30 * i)
    p.apply(tp.TASKS, _task("a"), 100.0)
    p.apply(tp.METRICS, ev.Metric(role="evaluator", name="eval/policy/success", value=0.4, step=0,
                                  labels={"level": "2"}), 100.0)  # fmt: skip
    p.apply(tp.METRICS, ev.Metric(role="evaluator", name="eval/reward/accuracy", value=0.6, step=0), 100.0)
    index = write_report(p, tmp_path / "report")
    page = index.read_text()
    for name in [
        "success_by_version",
        "process_accuracy",
        "versions",
        "variants",
        "verdict_agreement",
        "throughput",
        "difficulty",
        "staleness",
    ]:
        png = tmp_path / "report" / f"{name}.png"
        assert png.stat().st_size > 1000, name
        assert f'src="{name}.png"' in page
    assert json.loads((tmp_path / "report" / "summary.json").read_text())["policy_version"] == 5


def test_progress_memory_stays_flat_over_ten_times_its_bounds() -> None:
    """`up` folds every event of a run of days: series keep their whole time range at a coarser step,
    the redelivery window is bounded, staleness is a histogram, and the figures stay exact."""
    from app.progress import MAX_POINTS

    p = Progress()
    p.judged_keys = type(p.judged_keys)(1000)
    events = 10 * MAX_POINTS
    for i in range(events):
        p.apply(tp.JUDGED, _judged(f"r{i}", 0, 1 if i % 4 == 0 else -1, [1]), float(i))
        p.apply(tp.METRICS, ev.Metric(role="policy-learner", name="staleness", value=1.5), float(i))
        p.apply(tp.TASKS, _task(f"t{i % 7}", difficulty=i % 3), float(i))
    assert max(len(s.t) for s in p.series.values()) <= MAX_POINTS
    assert len(p.difficulty_snapshots) <= MAX_POINTS and len(p.judged_keys) <= 1000
    trajectories = p.series["trajectories"]
    assert trajectories.t[0] == 0.0 and trajectories.t[-1] == events - 1  # the whole range
    assert trajectories.y[-1] == events and p.snapshot()["trajectories"] == events
    assert p.snapshot()["staleness_mean"] == 1.5 and p.staleness == {1: events}
    p.apply(tp.JUDGED, _judged(f"r{events - 1}", 0, 1, [1]), float(events))  # a redelivery: not counted
    assert p.snapshot()["trajectories"] == events
