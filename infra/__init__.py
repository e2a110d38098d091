"""Plumbing shared by every role: broker, bus runtime, model backends, weight store, config, CLI."""
