"""forgestream envs."""
