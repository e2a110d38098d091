"""Reward learner role.

Consumes: forge.samples.reward (RewardSampleBatch; group "reward-learner").
Produces: WeightsPublished (model "reward") on forge.weights, reward-model weights in the weight
          store for the judges, metrics learner/reward/* and `staleness` (label model=reward).
Invariant: as the policy learner — each sample_key trains the surviving weights at most once and
offsets are committed only after a checkpoint that includes them (the loop lives in learners.core).
"""

from __future__ import annotations

import anyio

from learners.core import LearnerSpec, run_learner
from schemas import topics
from schemas.config import RunConfig


def spec(config: RunConfig) -> LearnerSpec:
    return LearnerSpec(
        name="reward",
        topic=topics.SAMPLES_REWARD,
        group="reward-learner",
        version_field="reward_version",
        model=config.reward_model,
        learner=config.reward_learner,
        eta=config.reward_learner.eta,
    )


async def run(config: RunConfig, *, shutdown: anyio.Event | None = None) -> None:
    await run_learner(config, spec(config), shutdown=shutdown)
