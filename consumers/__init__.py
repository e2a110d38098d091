"""forgestream consumers."""
