"""`forgestream up`: the main job on one machine (see app/up.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from app.cli import BootstrapOpt, ConfigOpt, app, build_config, domain_flags, fail


@app.command()
def up(
    config: ConfigOpt = None,
    workdir: Annotated[
        Path | None,
        typer.Option(
            help="Run folder: broker data, models, weights, checkpoints, logs, report "
            "[default: the config's workdir, .work/run]."
        ),
    ] = None,
    ephemeral: Annotated[bool, typer.Option(help="Broker in memory (nothing survives the run).")] = False,
    bootstrap: BootstrapOpt = None,
    minutes: Annotated[float | None, typer.Option(min=0.05, help="Stop after this many minutes.")] = None,
    updates: Annotated[int | None, typer.Option(min=1, help="Stop after this many policy versions.")] = None,
    domain: Annotated[
        str | None,
        typer.Option(
            help="household, arith, code, textworld or textworld-custom; also the tiny presets' bootstrap domain."
        ),
    ] = None,
    preset: Annotated[
        str | None, typer.Option(help="Policy model preset: tiny, smollm2-135m, hf:PATH.")
    ] = None,
    reward_preset: Annotated[
        str | None, typer.Option(help="Reward-model preset (defaults to the config's).")
    ] = None,
    actors: Annotated[int, typer.Option(min=1, max=64, help="Actor processes to start.")] = 1,
    judges: Annotated[
        int,
        typer.Option(min=1, max=64, help="Judge processes to start (the reward model is the slower stage)."),
    ] = 2,
    live: Annotated[
        bool | None, typer.Option(help="Live table (default: when stdout is a terminal).")
    ] = None,
    light_roles_together: Annotated[
        bool,
        typer.Option(
            "--light-roles-together/--separate-light-roles",
            help="Run forge, signals, env-model and scheduler as tasks of one process.",
        ),
    ] = True,
    without: Annotated[
        list[str] | None,
        typer.Option(
            help="Do not start this role (repeatable): reward-learner freezes the reward model, "
            "env-model keeps the task set static."
        ),  # fmt: skip
    ] = None,
) -> None:
    """Broker, topics, models and every role on this machine, with live progress."""
    import sys

    import anyio

    from app.cli import require_broker
    from app.run_folder import WorkdirInUse
    from app.up import UpOptions, run_up
    from infra.broker import BrokerError

    flags = {
        "workdir": str(workdir) if workdir is not None else None,  # unset: the config file's stands
        "kafka.bootstrap": bootstrap,
        **domain_flags(domain),
        "policy_model.preset": preset,
        "reward_model.preset": reward_preset,
    }
    cfg = build_config(config, flags)
    from app.cli import ROLES

    skipped = frozenset(without or ())
    optional = {"reward-learner", "env-model", "evaluator"}
    if skipped - optional:
        bad = sorted(skipped - optional)[0]
        what = "a role the loop needs" if bad in ROLES else "not a role"
        fail(f"--without {bad}: {what}; only reward-learner, env-model or evaluator can be left out")
    if cfg.judge.verdicts != "model" and "reward-learner" not in skipped:
        fail(
            f"judge.verdicts = {cfg.judge.verdicts!r} leaves the reward learner nothing to train on: "
            "add --without reward-learner"
        )
    if bootstrap is not None:
        require_broker(cfg.kafka)
    # Roles are separate processes: hand them the same overrides through the environment.
    env = {
        "FORGESTREAM_SCHEDULER__DOMAIN": cfg.scheduler.domain,
        "FORGESTREAM_POLICY_MODEL__PRESET": cfg.policy_model.preset,
        "FORGESTREAM_REWARD_MODEL__PRESET": cfg.reward_model.preset,
        "FORGESTREAM_POLICY_MODEL__BOOTSTRAP_DOMAINS": json.dumps(list(cfg.policy_model.bootstrap_domains)),
        "FORGESTREAM_REWARD_MODEL__BOOTSTRAP_DOMAINS": json.dumps(list(cfg.reward_model.bootstrap_domains)),
    }
    options = UpOptions(
        config_path=str(config) if config else None,
        bootstrap=bootstrap,
        ephemeral=ephemeral,
        minutes=minutes,
        updates=updates,
        actors=actors,
        judges=judges,
        live=sys.stdout.isatty() if live is None else live,
        env=env,
        without=skipped,
        light_roles_together=light_roles_together,
    )
    try:
        code = anyio.run(run_up, cfg, options)
    except (BrokerError, WorkdirInUse) as e:
        fail(str(e))
    if code:
        raise typer.Exit(code)
