"""CLI commands beyond the core ones; each module registers itself on `infra.cli.app`."""
