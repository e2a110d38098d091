"""forgestream algorithm: the RLAnything math as pure functions (no I/O, nothing else of ours).

Importing this package does not import torch: `algorithm.loss` (the policy loss, the listed-token loss
and the listed-conditional term) is loaded on first access, so roles that only need rewards start fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from algorithm.rewards import (
    INVALID_VERDICT_REWARD,
    STD_EPS,
    consistency_raw,
    consistency_rewards,
    cure_test_raw,
    cure_test_rewards,
    first_unlisted_token,
    format_advantages,
    integrated_rewards,
    state_advantages,
    step_advantages,
    zscore,
)
from algorithm.signals import GroupSignals, PolicyTarget, RewardTarget, group_signals
from algorithm.staleness import capacity, filter_stale, groups_per_version
from algorithm.tasks import HIGH, LOW, Direction, accept, direction, group_accuracy, high_risk_steps

if TYPE_CHECKING:
    from algorithm.loss import listed_conditional_loss, listed_token_loss, policy_loss

__all__ = [
    "HIGH",
    "INVALID_VERDICT_REWARD",
    "LOW",
    "STD_EPS",
    "Direction",
    "GroupSignals",
    "PolicyTarget",
    "RewardTarget",
    "accept",
    "capacity",
    "consistency_raw",
    "consistency_rewards",
    "cure_test_raw",
    "cure_test_rewards",
    "direction",
    "filter_stale",
    "first_unlisted_token",
    "format_advantages",
    "group_accuracy",
    "group_signals",
    "groups_per_version",
    "high_risk_steps",
    "integrated_rewards",
    "listed_conditional_loss",
    "listed_token_loss",
    "policy_loss",
    "state_advantages",
    "step_advantages",
    "zscore",
]


def __getattr__(name: str) -> Any:
    if name in ("policy_loss", "listed_token_loss", "listed_conditional_loss"):
        from algorithm import loss

        return getattr(loss, name)
    raise AttributeError(f"module 'algorithm' has no attribute {name!r}")
