"""The model an actor or a judge serves: a generation backend that follows its published weights.

Actors serve the policy, judges the reward model. Each loads the model's preset, follows
`forge.weights` (`watcher.run`, started by the role in its task group) and loads a newer version
between its own units of work (`refresh`): episodes for actors, trajectories for judges. A version the
store refuses (wrong place, hash or shapes) is remembered by the watcher and not retried.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio

from infra.bus import Bus
from infra.models import load_backend
from infra.weights import WeightStore, WeightsWatcher
from schemas.config import RunConfig

WORKER = {"policy": "actor", "reward": "judge"}


@dataclass
class ServingModel:
    backend: Any
    watcher: WeightsWatcher
    worker_id: str  # "<actor|judge>-<host>-<pid>-<random>": names this process in events and metrics

    @property
    def version(self) -> int:
        return self.backend.version

    async def refresh(self) -> None:
        """Load the newest published version if there is a newer one (blocking work off the loop)."""
        if self.watcher.newer_than(self.backend.version) is not None:
            await anyio.to_thread.run_sync(self.watcher.apply, self.backend)


async def load_serving_model(config: RunConfig, bus: Bus, role: Literal["policy", "reward"]) -> ServingModel:
    """The role's backend (torch threads as configured), a watcher of its weights, and a worker id."""
    import torch

    model = config.policy_model if role == "policy" else config.reward_model
    torch.set_num_threads(model.torch_threads)
    workdir = Path(config.workdir)
    backend = await anyio.to_thread.run_sync(lambda: load_backend(model, role=role, workdir=workdir))
    worker_id = f"{WORKER[role]}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    return ServingModel(backend, WeightsWatcher(bus, WeightStore.for_run(config), role), worker_id)
