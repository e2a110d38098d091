"""CLI commands beyond the core ones; each module registers itself on `app.cli.app`."""
