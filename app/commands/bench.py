"""`forgestream bench`: run the benchmarks in benchmarks/ (results land in benchmarks/results/)."""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli import app, fail

BENCHMARKS = {
    "bus": "bus_throughput.py",
    "generation": "generation.py",
    "fanout": "weight_fanout.py",
    "learner": "learner_throughput.py",
    "learner_role": "learner_throughput.py --role",
    "actor_scaling": "actor_scaling.py",
    "staleness": "staleness.py",
    "async_vs_sync": "async_vs_sync.py",
    "judge": "judge_throughput.py",
    "learning": "learning.py",
    "presets": "presets.py",
    "update": "policy_update.py",
    "textworld": "textworld_ladder.py",
    "textworld_custom": "textworld_ladder.py --domain textworld-custom",
    "fuzz": "fuzz.py",
    "chaos": "chaos.py",
}


@app.command()
def bench(
    which: Annotated[str, typer.Argument(help="all, or one of: " + ", ".join(BENCHMARKS))] = "all",
) -> None:
    """Measure throughput ratios in one run each and write benchmarks/results/*.json."""
    import subprocess
    import sys

    from infra.broker import project_root

    names = list(BENCHMARKS) if which == "all" else [which]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        fail(f"unknown benchmark {unknown[0]!r}; choose all or one of {', '.join(BENCHMARKS)}")
    root = project_root()
    failed = []
    for name in names:
        file, *flags = BENCHMARKS[name].split()
        script = root / "benchmarks" / file
        if not script.is_file():
            fail(f"benchmark script {script} is missing (run from a source checkout)")
        typer.echo(f"== {name}: {' '.join([script.name, *flags])}")
        if subprocess.run([sys.executable, str(script), *flags], cwd=root).returncode != 0:
            failed.append(name)
    if failed:
        fail(f"benchmarks failed: {', '.join(failed)}", code=1)
