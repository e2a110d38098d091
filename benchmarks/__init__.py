"""System benchmarks (`forgestream bench`): each script measures in one run and writes benchmarks/results/."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """The environment for the `forgestream` processes a benchmark starts: this one's, without any
    FORGESTREAM_* override (the benchmark's settings are its own) but with the model cache, one thread
    per process; `extra` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGESTREAM_") or k == "FORGESTREAM_HOME"}
    return env | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"} | extra


def start_up(name: str, minutes: float, env: dict[str, str], *flags: str) -> tuple[Path, subprocess.Popen]:
    """`forgestream up --no-live --minutes M FLAGS` started in a fresh `.work/<name>` (its log in up.log
    there); returns the workdir and the process."""
    workdir = ROOT / ".work" / name
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    with open(workdir / "up.log", "wb") as log:
        up = subprocess.Popen([sys.executable, "-m", "app.cli", "up", "--no-live", "--minutes", str(minutes),
                               "--workdir", str(workdir), *flags], cwd=ROOT, stdout=log, stderr=log, env=env)  # fmt: skip
    return workdir, up


def run_up(name: str, minutes: float, env: dict[str, str], *flags: str) -> Path:
    """One `forgestream up --ephemeral --minutes M FLAGS` in a fresh `.work/<name>`; RuntimeError naming
    its log if it fails. Returns the workdir (report/summary.json, tensorboard/)."""
    workdir, up = start_up(name, minutes, env, "--ephemeral", *flags)
    if up.wait() != 0:
        raise RuntimeError(f"up ({name}) failed; see {workdir / 'up.log'}")
    return workdir


def restarts(workdir: Path) -> dict[str, int]:
    """Per role log: starts after the first (the supervisor writes a line at every start)."""
    out = {}
    for log in sorted((workdir / "logs").glob("*.log")):
        starts = re.findall(rb"=== \d\d:\d\d:\d\d start ", log.read_bytes())
        out[log.stem] = max(0, len(starts) - 1)
    return out


def wait_for_live(workdir: Path, up: subprocess.Popen, timeout_s: float = 300.0) -> str:
    """The broker address of the `up` writing into `workdir`, once its first trajectory has been judged."""
    import anyio

    from infra.bus import Bus
    from schemas.config import KafkaConfig
    from schemas.topics import JUDGED

    async def judged_once(bootstrap: str) -> bool:
        async with Bus(KafkaConfig(bootstrap=bootstrap), role="bench") as bus:
            return bool(await bus.read_topic(JUDGED, latest_per_key=False))

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise RuntimeError(f"up ended before the loop was live; see {workdir / 'up.log'}")
        broker = workdir / "broker.json"
        if broker.is_file():
            bootstrap = json.loads(broker.read_text())["bootstrap"]
            if anyio.run(judged_once, bootstrap):
                return bootstrap
        time.sleep(5)
    raise TimeoutError(f"no judged trajectory within {timeout_s:.0f} s; see {workdir / 'up.log'}")
