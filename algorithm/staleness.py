"""Off-policy bookkeeping: AReaL's capacity gate, the staleness filter, dropping zero advantages."""

from __future__ import annotations

from collections.abc import Sequence

ZERO_ADVANTAGE_ATOL = 1e-9  # |advantage| at or below this carries no gradient worth a sample


def capacity(
    max_concurrent: int, running: int, accepted: int, version: int, groups_per_version: int, eta: int
) -> int:
    """How many new rollouts the scheduler may start now (AReaL's gate), never negative.

    `min(max_concurrent - running, (eta + version + 1) * groups_per_version - (accepted + running))`:
    the first term bounds the work in flight; the second keeps every rollout (accepted by the
    learner so far or still running) within `eta` versions of the policy that will train on it,
    where `version` is the learner's current policy version and `groups_per_version` the rollout
    groups one version consumes (AReaL's batch size, counted in the unit the gate counts: groups).
    """
    in_reach = (eta + version + 1) * groups_per_version  # groups the next eta + 1 versions consume
    return max(0, min(max_concurrent - running, in_reach - (accepted + running)))


def filter_stale(sample_versions: Sequence[int], current_version: int, eta: int) -> tuple[list[int], int]:
    """Staleness bound: keep samples generated at most `eta` versions ago.

    Returns (indices of the kept samples, number dropped). A sample of version v is kept iff
    `v >= current_version - eta` (versions newer than current are kept too).
    """
    if eta < 0:
        raise ValueError(f"eta must be >= 0, got {eta}")
    kept = [i for i, v in enumerate(sample_versions) if v >= current_version - eta]
    return kept, len(sample_versions) - len(kept)
