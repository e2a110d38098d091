"""System benchmarks (`forgestream bench`): each script measures in one run and writes benchmarks/results/."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """The environment for the `forgestream` processes a benchmark starts: this one's, without any
    FORGESTREAM_* override (the benchmark's settings are its own) but with the model cache, one thread
    per process; `extra` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGESTREAM_") or k == "FORGESTREAM_HOME"}
    return env | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"} | extra


def run_up(name: str, minutes: float, env: dict[str, str]) -> Path:
    """One `forgestream up --ephemeral --minutes M` in a fresh `.work/<name>` (its log in up.log there);
    RuntimeError naming the log if it fails. Returns the workdir (report/summary.json, tensorboard/)."""
    workdir = ROOT / ".work" / name
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    with open(workdir / "up.log", "wb") as log:
        done = subprocess.run([sys.executable, "-m", "app.cli", "up", "--ephemeral", "--no-live", "--minutes",
                               str(minutes), "--workdir", str(workdir)], cwd=ROOT, stdout=log, stderr=log, env=env)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"up ({name}) failed; see {workdir / 'up.log'}")
    return workdir
