"""Policy learner role.

Consumes: forge.samples.policy (PolicySampleBatch; group "policy-learner").
Produces: WeightsPublished (model "policy") on forge.weights, policy weights in the weight store,
          metrics learner/policy/* and `staleness`.
Invariant: each sample_key trains the surviving weights at most once; offsets are committed only
after a checkpoint that includes them (the loop lives in learners.core).
"""

from __future__ import annotations

import anyio

from learners.core import LearnerSpec, run_learner
from schemas import topics
from schemas.config import RunConfig


def spec(config: RunConfig) -> LearnerSpec:
    return LearnerSpec(
        name="policy",
        topic=topics.SAMPLES_POLICY,
        group="policy-learner",
        version_field="policy_version",
        model=config.policy_model,
        learner=config.policy_learner,
        eta=config.off_policy.eta,
    )


async def run(config: RunConfig, *, shutdown: anyio.Event | None = None) -> None:
    await run_learner(config, spec(config), shutdown=shutdown)
