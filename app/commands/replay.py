"""`forgestream replay`: recompute reward-model samples from the judged topic and retrain."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from app.cli import BootstrapOpt, ConfigOpt, PrefixOpt, app, build_config, fail


def _when(text: str | None, default: datetime, flag: str) -> datetime:
    if text is None:
        return default
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(f"{flag}: {text!r} is not an ISO-8601 date/time (e.g. 2026-11-30T09:00:00Z)")
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@app.command()
def replay(
    out: Annotated[Path, typer.Option(help="Folder for the samples, the trained model and replay.json.")],
    since: Annotated[
        str | None, typer.Option(help="ISO time; records at or after it (default: all).")
    ] = None,
    until: Annotated[str | None, typer.Option(help="ISO time; records before it (default: now).")] = None,
    train_reward_model: Annotated[
        bool, typer.Option(help="Train a reward-model version on the samples.")
    ] = False,
    lam: Annotated[
        float | None, typer.Option(min=0.0, help="λ for R = O + λ·mean S (default: config).")
    ] = None,
    rm_lam: Annotated[
        float | None,
        typer.Option(
            min=0.0, help="λ of the reward model's consistency reward (default: config's signals.rm_lam)."
        ),
    ] = None,
    start_from: Annotated[
        str, typer.Option("--from", help="preset, latest, vN, or an HF model folder.")
    ] = "preset",
    epochs: Annotated[int, typer.Option(min=1, max=100)] = 1,
    publish: Annotated[
        bool, typer.Option(help="Publish the trained model as the next reward version.")
    ] = False,
    config: ConfigOpt = None,
    bootstrap: BootstrapOpt = None,
    topic_prefix: PrefixOpt = None,
    workdir: Annotated[
        Path | None, typer.Option(help="A run folder (its broker is started if stopped).")
    ] = None,
) -> None:
    """Read forge.trajectories.judged from the beginning, keep a time range, rebuild RM samples, retrain."""
    import anyio

    from app.run_folder import kafka_for
    from infra.broker import BrokerError

    flags = {"kafka.topic_prefix": topic_prefix, "signals.lam": lam, "signals.rm_lam": rm_lam}
    if workdir is not None:
        flags["workdir"] = str(workdir)
    cfg = build_config(config, flags)
    t_since = _when(since, datetime.fromtimestamp(0, UTC), "--since")
    t_until = _when(until, datetime.now(UTC), "--until")
    if publish and not train_reward_model:
        fail("--publish needs --train-reward-model")

    async def main() -> dict:
        import msgspec

        from learners.replay import replay as run_replay

        async with kafka_for(cfg.kafka, bootstrap=bootstrap, workdir=workdir) as kafka:
            result = await run_replay(
                msgspec.structs.replace(cfg, kafka=kafka),
                since=t_since,
                until=t_until,
                out=out,
                train=train_reward_model,
                start_from=start_from,
                epochs=epochs,
                publish=publish,
            )
        return result.summary()

    try:
        summary = anyio.run(main)
    except (BrokerError, ValueError) as e:
        fail(str(e))
    typer.echo(json.dumps(summary, indent=2))
