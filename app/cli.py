"""`forgestream` command line: broker, topics, status, run ROLE (and commands other modules register).

Parses config before anything heavy is imported (no torch, no aiokafka at import time), so
`forgestream --help` is instant. Exit codes: 0 ok, 1 a role failed (cause logged), 2 bad config or
unreachable broker (one line naming the problem).

More commands: each module named in COMMAND_MODULES is imported before the app runs; it registers
itself with `from app.cli import app` and `@app.command()` (keep its top-level imports light).
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from infra.broker import Broker, BrokerError, die_with_parent, wait_reachable
from infra.config import ConfigError, load_config
from learners import tiny_preset  # noqa: F401  (registers the `tiny` preset's recipe with the model loaders)
from schemas.config import KafkaConfig, RunConfig

app = typer.Typer(
    name="forgestream",
    help="RLAnything closed-loop agent training as an event-driven streaming system on Kafka.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
topics_app = typer.Typer(help="Create or list the forgestream topics.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")

# role name -> module exposing `async def run(config: RunConfig, *, shutdown: anyio.Event | None = None)`
ROLES: dict[str, str] = {
    "scheduler": "producers.scheduler",
    "actor": "producers.actor",
    "judge": "consumers.judge",
    "signals": "consumers.signals",
    "forge": "consumers.forge",
    "env-model": "consumers.env_model",
    "policy-learner": "learners.policy",
    "reward-learner": "learners.reward",
    "evaluator": "consumers.evaluator",
}
# modules that add commands to `app`, each imported by main() before the app runs (an explicit list)
COMMAND_MODULES: tuple[str, ...] = (
    "app.commands.up",
    "app.commands.prepare",
    "app.commands.eval",
    "app.commands.replay",
    "app.commands.report",
    "app.commands.bench",
    "app.commands.dlq",
)

log = logging.getLogger("forgestream.cli")

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="TOML config file.", envvar="FORGESTREAM_CONFIG")
]
BootstrapOpt = Annotated[
    str | None, typer.Option("--bootstrap", "-b", help="Kafka host:port (overrides config).")
]
PrefixOpt = Annotated[
    str | None, typer.Option("--topic-prefix", help="Topic name prefix (overrides config).")
]


# How long a stopping role may drain before it is killed: `up` sends SIGKILL after this, and a role
# whose `up` died exits by itself after this (its drain may retry a broker that died with `up`).
DRAIN_GRACE_S = 20.0


def stop_with_supervisor(role: str, grace_s: float = DRAIN_GRACE_S) -> None:
    """Started by `up` (FORGESTREAM_SUPERVISOR): get SIGTERM when it dies, even by kill -9 (drain and
    stop, no orphans), and exit `grace_s` later whatever the drain is waiting on; refuse to start if
    it is already gone."""
    import signal
    import threading

    supervisor = os.environ.get("FORGESTREAM_SUPERVISOR")
    die_with_parent(signal.SIGTERM)
    if not supervisor:
        return
    if str(os.getppid()) != supervisor:
        fail(f"role {role}: its supervisor (pid {supervisor}) is gone; not starting", code=1)

    def exit_when_orphaned() -> None:
        while str(os.getppid()) == supervisor:
            time.sleep(0.5)
        time.sleep(grace_s)
        log.error("role %s: its supervisor (pid %s) died and the drain did not end within %.0f s; exiting",
                  role, supervisor, grace_s)  # fmt: skip
        logging.shutdown()
        os._exit(1)

    threading.Thread(target=exit_when_orphaned, name="orphan-watchdog", daemon=True).start()


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"forgestream: {message}", err=True)
    raise typer.Exit(code)


def build_config(config: Path | None, flags: dict[str, Any]) -> RunConfig:
    try:
        return load_config(config, flags=flags)
    except ConfigError as e:
        fail(str(e))


def domain_flags(domain: str | None) -> dict[str, Any]:
    """`--domain X`: the run's task domain, and the tiny presets' bootstrap domain with it (a preset
    bootstrapped on another domain's text does not know this one's words: the household preset
    answered TextWorld prompts out of format 98 times in 100). Unset: the config's."""
    if domain is None:
        return {}
    return {"scheduler.domain": domain, "policy_model.bootstrap_domains": [domain],
            "reward_model.bootstrap_domains": [domain]}  # fmt: skip


def kafka_from(config: Path | None, bootstrap: str | None, prefix: str | None) -> KafkaConfig:
    return build_config(config, {"kafka.bootstrap": bootstrap, "kafka.topic_prefix": prefix}).kafka


def require_broker(kafka: KafkaConfig, timeout_s: float = 3.0) -> None:
    try:
        wait_reachable(kafka.bootstrap, timeout_s=timeout_s)
    except BrokerError as e:
        fail(str(e))


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


@app.command()
def broker(
    port: Annotated[int, typer.Option(help="Port to listen on (127.0.0.1).")] = 9092,
    host: Annotated[str, typer.Option(help="Address to bind and advertise.")] = "127.0.0.1",
    durable: Annotated[bool, typer.Option(help="Keep data in an s3rver store under --data.")] = False,
    data: Annotated[Path, typer.Option(help="Data folder for durable mode and logs.")] = Path(".work/broker"),
) -> None:
    """Run the embedded Tansu broker in the foreground until Ctrl-C."""
    import signal

    b = Broker(port=port, host=host, durable=durable, data_dir=data)
    try:
        b.start()
    except BrokerError as e:
        fail(str(e))

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT):  # SIGINT too: it is ignored in background jobs
        signal.signal(sig, interrupt)
    mode = f"durable, data in {data}" if durable else "ephemeral (memory)"
    typer.echo(f"broker listening on {b.bootstrap} ({mode}); Ctrl-C to stop", err=True)
    try:
        code = b.wait()
    except KeyboardInterrupt:
        code = 0
    finally:
        b.stop()
    if code:
        fail(f"broker exited with code {code}; see {data}/tansu.log", code=1)


@topics_app.command("create")
def topics_create(
    config: ConfigOpt = None, bootstrap: BootstrapOpt = None, topic_prefix: PrefixOpt = None
) -> None:
    """Create every forgestream topic (idempotent)."""
    import anyio

    from infra.topics import create_topics

    kafka = kafka_from(config, bootstrap, topic_prefix)
    require_broker(kafka)
    created = anyio.run(create_topics, kafka)
    typer.echo(
        f"created {len(created)} topic(s)" + (": " + ", ".join(created) if created else " (all existed)")
    )


@topics_app.command("list")
def topics_list(
    config: ConfigOpt = None,
    bootstrap: BootstrapOpt = None,
    topic_prefix: PrefixOpt = None,
    all_topics: Annotated[bool, typer.Option("--all", help="Every topic, not only forgestream's.")] = False,
) -> None:
    """List the forgestream topics present on the cluster."""
    import anyio

    from infra.topics import list_topics

    kafka = kafka_from(config, bootstrap, topic_prefix)
    require_broker(kafka)
    for name in anyio.run(lambda: list_topics(kafka, all_topics=all_topics)):
        typer.echo(name)


@app.command()
def status(
    config: ConfigOpt = None,
    bootstrap: BootstrapOpt = None,
    topic_prefix: PrefixOpt = None,
    workdir: Annotated[
        Path | None, typer.Option(help="A run folder of `up` (its broker is started if stopped and durable).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Run figures (versions, success, tasks, variants), topics, groups, lag and dead letters."""
    import anyio

    from app.run_folder import kafka_for, read_progress
    from app.status import collect_status, render, render_figures

    cfg = build_config(config, {"kafka.topic_prefix": topic_prefix})
    if workdir is None:
        kafka = cfg.kafka if bootstrap is None else kafka_from(config, bootstrap, topic_prefix)
        require_broker(kafka)

    async def main() -> dict[str, Any]:
        async with kafka_for(cfg.kafka, bootstrap=bootstrap, workdir=workdir) as kafka:
            cluster = await collect_status(kafka)
            progress = await read_progress(kafka)
        lag = {g["group"]: g["total_lag"] for g in cluster["groups"]}
        return progress.snapshot(lag=lag) | {"cluster": cluster}

    try:
        result = anyio.run(main)
    except BrokerError as e:
        # An ephemeral run keeps no broker data; its last figures are in the report folder.
        summary = workdir / "report" / "summary.json" if workdir is not None else None
        if summary is None or not summary.is_file():
            fail(str(e))
        result = json.loads(summary.read_text()) | {"stopped": True}
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        from rich.console import Console

        console = Console()
        console.print(render_figures(result))
        if "cluster" in result:
            console.print(render(result["cluster"]))


@app.command()
def run(
    role: Annotated[
        str,
        typer.Argument(
            help="One of: " + ", ".join(ROLES) + "; or several joined by commas (tasks of one process)."
        ),
    ],
    config: ConfigOpt = None,
    bootstrap: BootstrapOpt = None,
    topic_prefix: PrefixOpt = None,
    workdir: Annotated[Path | None, typer.Option(help="Run folder (models, weights, checkpoints).")] = None,
    create_topics: Annotated[bool, typer.Option(help="Create missing topics first (idempotent).")] = True,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
) -> None:
    """Run one role (or several, as tasks of one process) until SIGTERM/SIGINT (graceful: finish
    in-flight work, commit, leave the group)."""
    roles = [r.strip() for r in role.split(",") if r.strip()]
    unknown = [r for r in roles if r not in ROLES]
    if unknown or not roles:
        fail(f"unknown role {(unknown or [role])[0]!r}; roles: {', '.join(ROLES)}")
    import signal

    supervisor = os.environ.get("FORGESTREAM_SUPERVISOR")
    if "TORCHELASTIC_RUN_ID" in os.environ:
        # a torchrun rank dies with its agent, even by kill -9: torchrun starts ranks in sessions of
        # their own, and a rank left alone would wait in a collective forever
        die_with_parent(signal.SIGKILL)
    elif supervisor:
        stop_with_supervisor(role)
    flags = {"kafka.bootstrap": bootstrap, "kafka.topic_prefix": topic_prefix}
    flags["workdir"] = str(workdir) if workdir is not None else None
    cfg = build_config(config, flags)
    require_broker(cfg.kafka)
    setup_logging(log_level)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    modules = [importlib.import_module(ROLES[r]) for r in roles]
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    exit_code = _run_roles(modules, cfg, create_topics, ",".join(roles))
    if exit_code:
        raise typer.Exit(exit_code)


def _run_roles(modules: list[Any], cfg: RunConfig, create_topics: bool, process: str) -> int:
    """Every role's `run` in one event loop; one failing stops the others (the process exits 1).
    Beside them the process reports its CPU and memory (app/usage.py), a last time once they end."""
    import anyio

    from app.usage import report_usage
    from infra.bus import Bus, install_signal_handlers
    from infra.topics import create_topics as create

    async def main() -> None:
        shutdown = anyio.Event()
        install_signal_handlers(shutdown)
        if create_topics:
            await create(cfg.kafka)
        roles_done = anyio.Event()
        async with Bus(cfg.kafka, role=process) as bus, anyio.create_task_group() as usage:
            usage.start_soon(report_usage, bus, process, roles_done)
            try:
                async with anyio.create_task_group() as tg:
                    for module in modules:
                        tg.start_soon(functools.partial(module.run, cfg, shutdown=shutdown))
            finally:
                roles_done.set()

    try:
        anyio.run(main)
    except KeyboardInterrupt:
        return 130
    except Exception:  # one role's error (an ExceptionGroup from the task group)
        log.exception("role(s) %s failed", ", ".join(m.__name__ for m in modules))
        return 1
    return 0


def _register_command_modules() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name)


def main() -> None:
    _register_command_modules()
    app()


if __name__ == "__main__":
    # `python -m app.cli` runs this file as __main__, a second copy of the module; command modules
    # register on `app.cli.app`, so hand over to the imported one.
    from app.cli import main as imported_main

    imported_main()
