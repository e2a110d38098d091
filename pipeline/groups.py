"""A rollout request's judged rollouts, gathered: the one home of "is this group whole?".

The n rollouts of a request arrive as separate judged events, possibly twice (redelivery after a
crash). The first copy of each rollout index counts; the group is whole at `group_size` distinct
rollouts. Signals gathers live groups with it; replay gathers them from a topic's history.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from schemas.events import JudgedTrajectory


@dataclass
class RolloutGroup:
    request_id: str
    group_size: int
    rollouts: dict[int, JudgedTrajectory] = field(default_factory=dict, kw_only=True)

    def add(self, judged: JudgedTrajectory) -> bool:
        """Keep the rollout unless a copy of its index is already here; False for a duplicate."""
        index = judged.trajectory.rollout_index
        if index in self.rollouts:
            return False
        self.rollouts[index] = judged
        return True

    @property
    def complete(self) -> bool:
        return len(self.rollouts) >= self.group_size

    def ordered(self) -> list[JudgedTrajectory]:
        """The rollouts by rollout index."""
        return [self.rollouts[i] for i in sorted(self.rollouts)]


def complete_groups(judged: Iterable[JudgedTrajectory]) -> tuple[dict[str, list[JudgedTrajectory]], int]:
    """The whole groups among `judged` (request id -> rollouts by index) and how many were not whole."""
    groups: dict[str, RolloutGroup] = {}
    for j in judged:
        t = j.trajectory
        groups.setdefault(t.request_id, RolloutGroup(t.request_id, t.group_size)).add(j)
    whole = {rid: g.ordered() for rid, g in groups.items() if g.complete}
    return whole, len(groups) - len(whole)
