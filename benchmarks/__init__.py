"""System benchmarks (`forgestream bench`): each script measures in one run and writes benchmarks/results/."""

from __future__ import annotations

import os


def child_env(**extra: str) -> dict[str, str]:
    """The environment for the `forgestream` processes a benchmark starts: this one's, without any
    FORGESTREAM_* override (the benchmark's settings are its own) but with the model cache, one thread
    per process; `extra` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGESTREAM_") or k == "FORGESTREAM_HOME"}
    return env | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"} | extra
