"""`forgestream report`: PNG plots and one HTML page, drawn from the topics of a run.

Input is a `Progress` folded from every record of the progress topics in timestamp order, so the
report of a running system and of a stopped one (durable broker restarted on its workdir) agree.
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path
from typing import Any

from app.progress import Progress


def _relative_minutes(ts: list[float], t0: float) -> list[float]:
    return [(t - t0) / 60.0 for t in ts]


def write_report(progress: Progress, out: Path, *, title: str = "forgestream run") -> Path:
    """Write PNGs and index.html into `out`; returns the HTML path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    starts = [s.t[0] for s in progress.series.values() if s.t]
    t0 = min(starts) if starts else time.time()
    figures: list[tuple[str, str]] = []

    def save(fig: Any, name: str, caption: str) -> None:
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=90)
        plt.close(fig)
        figures.append((name, caption))

    def plot_lines(name: str, caption: str, keys: list[str], ylabel: str, step: bool = False) -> None:
        fig, ax = plt.subplots(figsize=(7, 3.2))
        drawn = False
        for key in keys:
            s = progress.series.get(key)
            if s and s.t:
                x = _relative_minutes(s.t, t0)
                (ax.step(x, s.y, where="post", label=key) if step else ax.plot(x, s.y, label=key))
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("minutes since start")
        ax.set_ylabel(ylabel)
        if drawn:
            ax.legend(loc="best", fontsize=8)
        ax.grid(alpha=0.3)
        save(fig, name, caption)

    # Success per policy version: rollouts by the version they started with and their task's level
    # (marker size ~ count), and the evaluator's held-out success of evaluated versions, per level.
    fig, ax = plt.subplots(figsize=(7, 3.2))
    levels = sorted({lv for by_level in progress.success_by_version.values() for lv in by_level})
    for level in levels:
        versions = [v for v in sorted(progress.success_by_version) if level in progress.success_by_version[v]]
        tallies = [progress.success_by_version[v][level] for v in versions]
        ax.scatter(versions, [w / n for w, n in tallies], s=[8 + 2 * n for _, n in tallies], alpha=0.5,
                   label=f"training rollouts, level {level}")  # fmt: skip
    for level, by_version in sorted(progress.heldout.items()):
        xs = sorted(by_version)
        ax.plot(xs, [by_version[v] for v in xs], marker="o", label=f"held-out, level {level}")
    if not progress.success_by_version and not progress.heldout:
        ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(loc="best", fontsize=8)
    ax.set_xlabel("policy version")
    ax.set_ylabel("success")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    save(fig, "success_by_version", "Success per policy version: training rollouts and held-out evaluation")

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for name, by_version in sorted(progress.process_accuracy.items()):
        xs = sorted(by_version)
        ax.plot(xs, [by_version[v] for v in xs], marker="o", label=name)
    if progress.process_accuracy:
        ax.legend(loc="best", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no evaluation yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("reward-model version")
    ax.set_ylabel("process accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    save(fig, "process_accuracy", "Reward-model process accuracy on held-out steps (environment step labels)")
    plot_lines(
        "versions",
        "Policy and reward-model versions",
        ["policy_version", "reward_version"],
        "version",
        step=True,
    )
    plot_lines(
        "variants",
        "Environment variants accepted / rejected, tasks active / pending",
        ["variants_accepted", "variants_rejected", "tasks_active", "tasks_pending"],
        "count",
        step=True,
    )
    plot_lines(
        "verdict_agreement",
        "Reward-model verdict agreement with rollout outcomes",
        ["verdict_agreement"],
        "agreement",
    )
    plot_lines("throughput", "Judged trajectories (cumulative)", ["trajectories"], "trajectories")

    # Difficulty spread of the active set over time (stacked).
    fig, ax = plt.subplots(figsize=(7, 3.2))
    snaps = progress.difficulty_snapshots
    levels = sorted({lvl for _, spread in snaps for lvl in spread})
    if snaps and levels:
        x = _relative_minutes([t for t, _ in snaps], t0)
        ys = [[spread.get(lvl, 0) for _, spread in snaps] for lvl in levels]
        ax.stackplot(x, ys, labels=[f"level {lvl}" for lvl in levels], step="post")
        ax.legend(loc="upper left", fontsize=7)
    else:
        ax.text(0.5, 0.5, "no tasks yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("minutes since start")
    ax.set_ylabel("active tasks")
    save(fig, "difficulty", "Difficulty spread of the active task set")

    fig, ax = plt.subplots(figsize=(7, 3.2))
    if progress.staleness:
        versions = sorted(progress.staleness)
        ax.bar(versions, [progress.staleness[v] for v in versions], width=0.8)
    else:
        ax.text(0.5, 0.5, "no trained samples yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("learner version − sample version (batch mean, whole versions)")
    ax.set_ylabel("trained batches")
    save(fig, "staleness", "Staleness of trained samples (off-policy lag in versions)")

    snapshot = progress.snapshot()
    (out / "summary.json").write_text(json.dumps(snapshot, indent=2))
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in snapshot.items()
    )
    imgs = "".join(
        f'<figure><img src="{name}.png" alt="{html.escape(caption)}"><figcaption>{html.escape(caption)}</figcaption></figure>'
        for name, caption in figures
    )
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;max-width:1500px;margin:1em auto}"
        "figure{display:inline-block;margin:.5em}table{border-collapse:collapse}"
        "th,td{border:1px solid #ccc;padding:2px 8px;text-align:left}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>generated {time.strftime('%Y-%m-%d %H:%M:%S')}</p>"
        f"<table>{rows}</table>{imgs}</body></html>"
    )
    index = out / "index.html"
    index.write_text(page)
    return index
