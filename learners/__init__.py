"""forgestream learners."""
