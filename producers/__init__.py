"""forgestream producers."""
