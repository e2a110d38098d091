"""TextWorld domain: Microsoft TextWorld's cooking games, generated offline by the engine itself."""

from envs.textworld.env import LADDER, TextWorldEnv, TextWorldEpisode

__all__ = ["LADDER", "TextWorldEnv", "TextWorldEpisode"]
