"""Off-policy bookkeeping: AReaL's capacity gate, the staleness filter, dropping zero advantages."""

from __future__ import annotations

import math
from collections.abc import Sequence

ZERO_ADVANTAGE_ATOL = 1e-9  # |advantage| at or below this carries no gradient worth a sample


def capacity(
    max_concurrent: int, running: int, accepted: int, consumed: int, per_version: float, eta: int
) -> int:
    """How many new rollouts the scheduler may start now (AReaL's gate), never negative.

    `min(max_concurrent - running, floor((eta + 1) * per_version) - (ahead + running))`, with
    `ahead = max(0, accepted - consumed)`: the groups accepted for training that the learner has not
    consumed (trained or dropped) yet. The second term keeps every rollout still running or queued at
    the learner within the next `eta` + 1 versions, so within `eta` versions of the policy that trains
    on it. It is AReaL's `(eta + version + 1) * batch - (accepted + running)` with what the learner
    consumed counted rather than assumed to be `version * batch`: a version is whole groups until a
    sample count, not a fixed number of groups, and an assumed count drifts.
    """
    in_reach = math.floor((eta + 1) * per_version + 1e-9)  # groups the next eta + 1 versions consume
    ahead = max(0, accepted - consumed)
    return max(0, min(max_concurrent - running, in_reach - (ahead + running)))


def groups_per_version(consumed: int, version: int, at_least: int = 1) -> float:
    """The rollout groups one policy version has consumed on average (trained, or dropped as stale),
    never below `at_least`, and `at_least` before the first version. The learner's versions are
    whole groups until `batch_samples` samples, so this follows the groups' sizes without a setting of
    its own; `at_least` is what a version surely takes (`publish_every` batches of one group or more).
    Without it, a learner whose first version needs more groups than the gate's `eta + 1` at one per
    version would wait for groups the gate never admits."""
    return max(float(at_least), consumed / version) if version > 0 else float(at_least)


def filter_stale(sample_versions: Sequence[int], current_version: int, eta: int) -> tuple[list[int], int]:
    """Staleness bound: keep samples generated at most `eta` versions ago.

    Returns (indices of the kept samples, number dropped). A sample of version v is kept iff
    `v >= current_version - eta` (versions newer than current are kept too).
    """
    if eta < 0:
        raise ValueError(f"eta must be >= 0, got {eta}")
    kept = [i for i, v in enumerate(sample_versions) if v >= current_version - eta]
    return kept, len(sample_versions) - len(kept)
