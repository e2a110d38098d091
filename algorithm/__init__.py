"""forgestream algorithm."""
