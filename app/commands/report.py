"""`forgestream report`: PNG plots and one HTML page of a run, from its topics."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from app.cli import BootstrapOpt, ConfigOpt, PrefixOpt, app, build_config, fail


@app.command()
def report(
    out: Annotated[Path, typer.Option(help="Folder for index.html and the PNGs.")] = Path(".work/report"),
    config: ConfigOpt = None,
    bootstrap: BootstrapOpt = None,
    topic_prefix: PrefixOpt = None,
    workdir: Annotated[
        Path | None, typer.Option(help="A run folder (its broker is started if stopped).")
    ] = None,
) -> None:
    """Success rate, versions, variants, difficulty spread, verdict agreement, staleness, throughput."""
    import anyio

    from app.report import write_report
    from app.run_folder import kafka_for, read_progress
    from infra.broker import BrokerError

    cfg = build_config(config, {"kafka.topic_prefix": topic_prefix})

    async def main() -> Path:
        async with kafka_for(cfg.kafka, bootstrap=bootstrap, workdir=workdir) as kafka:
            progress = await read_progress(kafka)
        return write_report(progress, out, title=f"forgestream report — {workdir or kafka.bootstrap}")

    try:
        index = anyio.run(main)
    except BrokerError as e:
        fail(str(e))
    typer.echo(f"report: {index}")
