"""`forgestream prepare`: build and cache the model presets a config names, before any run needs them.

The first `up` on a fresh machine would do the same, but a role started alone (`run actor`) or a
test waiting for its first rollout should not spend minutes of its own time on a bootstrap SFT.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from app.cli import ConfigOpt, app, build_config, domain_flags


@app.command()
def prepare(
    config: ConfigOpt = None,
    workdir: Annotated[Path | None, typer.Option(help="Cache here when FORGESTREAM_HOME is unset.")] = None,
    domain: Annotated[
        str | None, typer.Option(help="Bootstrap the tiny presets on this domain (default: the config's).")
    ] = None,
) -> None:
    """Build (or find cached) the policy and reward presets; print their folders."""
    flags = domain_flags(domain) | ({} if workdir is None else {"workdir": str(workdir)})
    cfg = build_config(config, flags)
    from infra.models import prepare_run_models

    start = time.monotonic()
    for role, folder in prepare_run_models(cfg, Path(cfg.workdir)).items():
        typer.echo(f"{role}: {folder}")
    typer.echo(f"ready in {time.monotonic() - start:.0f} s")
