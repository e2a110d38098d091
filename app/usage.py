"""Where a run's CPU goes: every role process reports its own CPU seconds and peak memory as metrics.

Each `forgestream run ROLE` process sends `process/cpu_s` (user + system seconds since it started,
its waited-for children included) and `process/rss_peak_mb` every `every_s` and once more after its
roles have drained, labelled with the process's roles and pid. `Progress` folds them per process
(the last report of each pid, summed over a role's processes and restarts), so `status --json`, the
report's summary and TensorBoard say where the time went on any machine the roles run on.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from infra.bus import Bus

log = logging.getLogger(__name__)

CPU_METRIC = "process/cpu_s"
RSS_METRIC = "process/rss_peak_mb"


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it has waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def rss_peak_mb() -> float:
    """This process's peak resident memory in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


async def report_usage(bus: Bus, process: str, done: anyio.Event, every_s: float = 15.0) -> None:
    """Send this process's usage every `every_s` until `done` is set, then once more. A failed send
    is logged and never stops the roles (the figures are for people, not for the loop)."""
    labels = {"process": process, "pid": str(os.getpid())}
    while True:
        with anyio.move_on_after(every_s):
            await done.wait()
        try:
            await bus.metric(CPU_METRIC, cpu_seconds(), **labels)
            await bus.metric(RSS_METRIC, rss_peak_mb(), **labels)
        except Exception as e:  # noqa: BLE001 - a usage report must not take a role down
            log.warning("usage report not sent: %s", e)
        if done.is_set():
            return
