"""`python -m app.ranks N ROLE`: how `up` starts a learner role on N ranks.

It asks the kernel to stop it (SIGTERM) when `up` dies, even by kill -9, then becomes torchrun's
agent (`exec`: the death signal survives it), which starts N `forgestream run ROLE` ranks on this
machine and stops them when it stops; each rank also dies with the agent (see `app.cli.run`).
Rank 0 reads Kafka and every rank trains its share of each batch (`learners.core`).
"""

from __future__ import annotations

import os
import sys


def torchrun_argv(ranks: int, role: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
            "-m", "app.cli", "run", role]  # fmt: skip


def main(argv: list[str]) -> None:
    from app.cli import stop_with_supervisor

    ranks, role = int(argv[0]), argv[1]
    stop_with_supervisor(role)
    argv = torchrun_argv(ranks, role)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
