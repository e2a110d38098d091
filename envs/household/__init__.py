"""The household domain (AlfWorld-like): `HouseholdEnv`, its episodes and the oracle progress label."""

from envs.household.env import HouseholdEnv, HouseholdEpisode, step_explores, step_is_progress
from envs.household.tasks import LADDER
from envs.household.world import State, World

__all__ = [
    "LADDER",
    "HouseholdEnv",
    "HouseholdEpisode",
    "State",
    "World",
    "step_explores",
    "step_is_progress",
]
