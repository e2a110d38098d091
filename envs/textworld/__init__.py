"""TextWorld domains: Microsoft TextWorld's cooking and custom games, generated offline by the engine."""

from envs.textworld.env import CUSTOM_LADDER, LADDER, TextWorldCustomEnv, TextWorldEnv, TextWorldEpisode

__all__ = ["CUSTOM_LADDER", "LADDER", "TextWorldCustomEnv", "TextWorldEnv", "TextWorldEpisode"]
