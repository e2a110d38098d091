"""`forgestream up`: the whole closed loop on one machine.

Starts (or reuses, with `--bootstrap`) a broker, creates the topics, builds or loads the model
presets once, then runs every role as its own `forgestream run ROLE` process — exactly what a
multi-machine deployment runs — and shows live progress folded from the topics. Stops after
`--minutes` or `--updates`, or on Ctrl-C: roles get SIGTERM (they drain, commit and leave their
groups), then SIGKILL after a grace period. Running `up` again on the same workdir resumes: the
durable broker keeps topics and group offsets, learners restore their checkpoints.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import Process

from app.cli import DRAIN_GRACE_S
from schemas.config import RunConfig

if TYPE_CHECKING:
    from rich.console import Console

    from app.progress import Progress
    from infra.broker import Broker
    from schemas.events import Metric

# Start order matters only for speed: consumers first so nothing waits on a rebalance for long.
ROLE_ORDER = [
    "forge",
    "signals",
    "env-model",
    "policy-learner",
    "reward-learner",
    "evaluator",
    "judge",
    "actor",
    "scheduler",
]

# Roles that need little CPU and no model: by default one process runs them all as tasks (fewer
# interpreters on a small machine); `--separate-light-roles` gives each its own.
LIGHT_ROLES = ("forge", "signals", "env-model", "scheduler")

# Metric labels that make a TensorBoard curve of their own: a process's usage, the evaluator's held-out
# level and mode. Other labels (a task, a reason) would make a curve per value and stay out of the tag.
CURVE_LABELS = ("process", "level", "mode")


def board_tag(metric: Metric) -> str:
    """The TensorBoard tag of a metric: its name, then its curve labels' values in CURVE_LABELS order."""
    return metric.name + "".join(f"/{metric.labels[k]}" for k in CURVE_LABELS if metric.labels.get(k))


# Roles off the policy's critical path run at a lower CPU priority: on a small machine the actor ->
# judge -> signals -> policy learner chain gets the cores first, and these use what is left.
NICENESS: dict[str, int] = {"evaluator": 10, "reward-learner": 5}


@dataclass
class RoleProcess:
    role: str
    index: int
    log_path: Path
    process: Process | None = None
    restarts: int = 0  # since the last healthy period
    started_at: float = 0.0
    restart_at: float | None = None  # exited with an error: when to start it again
    ranks: int = 1  # > 1: a learner under torchrun, one process per rank

    @property
    def name(self) -> str:
        if "," in self.role:
            return "light-roles"
        return self.role if self.index == 0 else f"{self.role}-{self.index}"

    @property
    def order(self) -> int:
        """Its place in ROLE_ORDER (a process of several roles: its latest role's)."""
        return max(ROLE_ORDER.index(r) for r in self.role.split(","))


@dataclass(frozen=True)
class RestartPolicy:
    """When a role that exited with an error starts again. A role that ran `healthy_s` before failing
    starts a fresh budget (a run of days survives occasional faults); exits while the broker is down
    are the outage's, not the role's, and spend nothing (the run pauses and resumes); otherwise
    backoff doubles from `first_backoff_s` up to `max_backoff_s`, and `max_restarts` failures in a
    row end the run (a crash loop)."""

    max_restarts: int = 3
    healthy_s: float = 120.0
    first_backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    def next_start(self, rp: RoleProcess, now: float, broker_up: bool) -> float | None:
        """When to start `rp` again (None: give up); updates its restart count."""
        if now - rp.started_at >= self.healthy_s:
            rp.restarts = 0
        if not broker_up:
            return now + self.first_backoff_s
        if rp.restarts >= self.max_restarts:
            return None
        rp.restarts += 1
        return now + min(self.max_backoff_s, self.first_backoff_s * 2 ** (rp.restarts - 1))


@dataclass
class BrokerWatch:
    """When `up` restarts a durable broker that runs but does not answer: after `unresponsive_s` of
    failed probes in a row (one every `probe_every_s`). Longer than the 60 s outage a run must wait
    out by itself (`bench chaos` freezes the broker that long), since a restart costs the roles a
    reconnect; a broker restarted on its data keeps its topics and offsets. Seen here: s3rver went on
    running but reset every connection 25 minutes into a durable run, so Tansu answered nothing and the
    run idled to its end; a fresh s3rver on the same data served it at once."""

    probe_every_s: float = 15.0
    unresponsive_s: float = 90.0
    silent_since: float | None = None

    def restart_now(self, answered: bool, now: float) -> bool:
        """Record one probe at `now`; True when the broker has not answered for `unresponsive_s`."""
        if answered:
            self.silent_since = None
            return False
        if self.silent_since is None:
            self.silent_since = now
        if now - self.silent_since < self.unresponsive_s:
            return False
        self.silent_since = None  # the restart starts a fresh count
        return True


def _restart_broker(broker: Broker, console: Console, why: str) -> None:
    from infra.broker import BrokerError

    console.print(f"{why}: restarting it on its data (roles reconnect)")
    try:
        broker.restart()  # main thread: it dies with us (die_with_parent)
    except BrokerError as e:
        console.print(f"broker restart failed ({e}); retrying")


@dataclass
class UpOptions:
    config_path: str | None
    bootstrap: str | None
    ephemeral: bool
    minutes: float | None
    updates: int | None
    actors: int
    live: bool
    judges: int = 1
    restarts: RestartPolicy = field(default_factory=RestartPolicy)
    grace_s: float = DRAIN_GRACE_S
    light_roles_together: bool = True  # LIGHT_ROLES as tasks of one process
    env: dict[str, str] = field(default_factory=dict)  # config overrides handed to every role
    without: frozenset[str] = frozenset()  # roles not started (e.g. a frozen reward model, a static env)


def role_command(role: str, ranks: int = 1) -> list[str]:
    if ranks > 1:
        return [sys.executable, "-m", "app.ranks", str(ranks), role]
    return [sys.executable, "-m", "app.cli", "run", role]


async def _spawn(rp: RoleProcess, env: dict[str, str]) -> None:
    rp.log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(rp.log_path, "ab")  # noqa: SIM115 - the child owns it for its lifetime
    log.write(f"\n=== {time.strftime('%H:%M:%S')} start {rp.name} (restart {rp.restarts})\n".encode())
    log.flush()
    rp.process = await anyio.open_process(
        role_command(rp.role, rp.ranks), stdout=log, stderr=log, env=env, start_new_session=True
    )
    rp.started_at = time.time()
    log.close()
    if NICENESS.get(rp.role):
        os.setpriority(os.PRIO_PROCESS, rp.process.pid, NICENESS[rp.role])


def _broker_usage(broker: Broker, progress: Progress) -> None:
    """The embedded broker's processes (Tansu, its object store) into the run's CPU figures."""
    import psutil

    for name, pid in broker.pids.items():
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                times, rss = proc.cpu_times(), proc.memory_info().rss
        except psutil.Error:  # gone between the listing and the read: its last figures stand
            continue
        progress.add_usage(
            f"broker:{name}", str(pid), cpu_s=times.user + times.system, rss_peak_mb=rss / 2**20
        )


async def _supervise(
    procs: list[RoleProcess],
    policy: RestartPolicy,
    env: dict[str, str],
    *,
    broker_bootstrap: str,
    console: Any,
) -> bool:
    """Restart roles that exited with an error, per `policy`; False when one is in a crash loop."""
    from infra.broker import BrokerError, wait_reachable

    now = time.time()
    for rp in procs:
        if rp.process is None or rp.process.returncode in (None, 0):
            continue
        if rp.restart_at is None:
            try:
                wait_reachable(broker_bootstrap, timeout_s=0.5)
                broker_up = True
            except BrokerError:
                broker_up = False
            rp.restart_at = policy.next_start(rp, now, broker_up)
            if rp.restart_at is None:
                console.print(f"role {rp.name} keeps failing ({rp.restarts} restarts); see {rp.log_path}")
                return False
            why = "" if broker_up else " (broker unreachable: waiting for it)"
            console.print(f"role {rp.name} exited with {rp.process.returncode}{why}; see {rp.log_path}")
        if now >= rp.restart_at:
            rp.restart_at = None
            await _spawn(rp, env)
    return True


async def _stop(procs: list[RoleProcess], grace_s: float) -> None:
    """SIGTERM producers first (no new work), then the rest; SIGKILL whatever outlives the grace."""
    for rp in sorted(procs, key=lambda p: -p.order):
        if rp.process is not None and rp.process.returncode is None:
            try:
                os.killpg(rp.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    with anyio.move_on_after(grace_s):
        for rp in procs:
            if rp.process is not None:
                await rp.process.wait()
    for rp in procs:
        if rp.process is not None and rp.process.returncode is None:
            try:
                os.killpg(rp.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await rp.process.wait()


def _render(progress: Any, procs: list[RoleProcess], elapsed: float) -> Any:
    from rich.table import Table

    snap = progress.snapshot()
    table = Table(title=f"forgestream up — {elapsed / 60:.1f} min", show_header=False, min_width=60)
    table.add_column("figure", style="bold")
    table.add_column("value")
    table.add_row("policy / reward version", f"{snap['policy_version']} / {snap['reward_version']}")
    table.add_row("success rate (rolling)", f"{snap['success_rate']:.2f}")
    table.add_row("trajectories judged", f"{snap['trajectories']}  ({snap['trajectories_per_s']:.2f}/s)")
    table.add_row("samples trained (policy)", str(snap["samples_trained"]))
    table.add_row(
        "tasks active / pending",
        f"{snap['tasks_active']} / {snap['tasks_pending']}",
    )
    table.add_row(
        "variants accepted / rejected", f"{snap['variants_accepted']} / {snap['variants_rejected']}"
    )
    table.add_row("staleness (mean versions)", f"{snap['staleness_mean']:.2f}")
    table.add_row("dead letters", str(snap["dlq"]))
    alive = sum(1 for rp in procs if rp.process is not None and rp.process.returncode is None)
    table.add_row(
        "role processes alive", f"{alive}/{len(procs)}  restarts {sum(rp.restarts for rp in procs)}"
    )
    return table


async def run_up(config: RunConfig, options: UpOptions) -> int:
    """Run the loop, holding its workdir (a second `up` on it fails at once); returns the exit code."""
    from app.run_folder import hold_workdir

    with hold_workdir(Path(config.workdir).resolve()):
        return await _run_up(config, options)


async def _run_up(config: RunConfig, options: UpOptions) -> int:
    from rich.console import Console
    from rich.live import Live

    from app.progress import PROGRESS_TOPICS, Progress
    from app.run_folder import record_broker
    from infra.broker import Broker
    from infra.bus import Bus
    from infra.topics import create_topics
    from schemas.topics import JUDGED, METRICS

    console = Console(stderr=False)
    workdir = Path(config.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    broker: Broker | None = None
    bootstrap = options.bootstrap
    if bootstrap is None:
        broker = Broker(durable=not options.ephemeral, data_dir=workdir / "broker")
        broker.start()  # on the main thread, so the broker is told to die with us (see die_with_parent)
        bootstrap = broker.bootstrap
        console.print(f"broker: {'memory' if options.ephemeral else 'durable'} Tansu at {bootstrap}")
    shutdown = anyio.Event()
    exit_code = 0
    try:
        import msgspec

        kafka = msgspec.structs.replace(config.kafka, bootstrap=bootstrap)
        config = msgspec.structs.replace(config, kafka=kafka, workdir=str(workdir))
        await create_topics(kafka)
        record_broker(workdir, bootstrap, durable=broker is not None and not options.ephemeral)

        # Build the presets once here, so role processes load them instead of racing to build.
        from infra.models import prepare_run_models

        console.print("models: preparing policy and reward presets (cached after the first run)")
        folders = await anyio.to_thread.run_sync(lambda: prepare_run_models(config, workdir))
        for role, path in folders.items():
            console.print(f"  {role}: {path}")

        env = dict(os.environ)
        env.update(options.env)
        env.update(
            {
                "FORGESTREAM_KAFKA__BOOTSTRAP": bootstrap,
                "FORGESTREAM_WORKDIR": str(workdir),
                "FORGESTREAM_SUPERVISOR": str(os.getpid()),  # roles die with `up`, even after a kill -9
                "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if options.config_path:
            env["FORGESTREAM_CONFIG"] = str(Path(options.config_path).resolve())
        procs: list[RoleProcess] = []
        light = [r for r in ROLE_ORDER if r in LIGHT_ROLES and r not in options.without]
        if options.light_roles_together and light:
            procs.append(RoleProcess(",".join(light), 0, workdir / "logs" / "light-roles.log"))
        ranks = {"policy-learner": config.policy_learner.ranks, "reward-learner": config.reward_learner.ranks}
        for role in ROLE_ORDER:
            copies = {"actor": options.actors, "judge": options.judges,
                      "evaluator": int(config.evaluator.enabled)}.get(role, 1)  # fmt: skip
            if role in options.without or (options.light_roles_together and role in LIGHT_ROLES):
                continue
            for i in range(copies):
                log_path = workdir / "logs" / f"{role}{'' if i == 0 else f'-{i}'}.log"
                procs.append(RoleProcess(role, i, log_path, ranks=ranks.get(role, 1)))

        progress = Progress()
        # The progress readers stop after the roles: the summary then holds what they wrote while stopping.
        followed = anyio.Event()
        async with Bus(kafka, role="up") as bus, anyio.create_task_group() as tg:
            from torch.utils.tensorboard import SummaryWriter

            board = SummaryWriter(
                str(workdir / "tensorboard")
            )  # `tensorboard --logdir <workdir>/tensorboard`

            async def follow(topic: str) -> None:
                async for record in bus.follow_topic(topic, shutdown=followed, drain_s=30.0):
                    t = record.timestamp_ms / 1000.0
                    progress.apply(record.topic, record.value, t)
                    if record.topic == METRICS:  # every role's metrics, by name, against wall time
                        board.add_scalar(
                            board_tag(record.value),
                            record.value.value,
                            walltime=t,
                            global_step=max(0, int(t - progress.started)),
                        )
                    elif record.topic == JUDGED:
                        board.add_scalar(
                            "run/success_rate",
                            progress.success_rate,
                            walltime=t,
                            global_step=max(0, int(t - progress.started)),
                        )

            for topic in PROGRESS_TOPICS:
                tg.start_soon(follow, topic)
            for rp in procs:
                await _spawn(rp, env)
            console.print(f"roles: {len(procs)} processes, logs in {workdir / 'logs'}")

            def on_signal(*_: Any) -> None:
                shutdown.set()

            signal.signal(signal.SIGINT, on_signal)
            signal.signal(signal.SIGTERM, on_signal)
            start = time.time()  # the clock starts once the roles run, not while presets build
            deadline = start + options.minutes * 60 if options.minutes else None
            start_version: int | None = None
            last_line = last_usage = last_probe = 0.0
            watch = BrokerWatch()
            live = (
                Live(_render(progress, procs, 0), console=console, refresh_per_second=2)
                if options.live
                else None
            )
            if live:
                live.start()
            try:
                while not shutdown.is_set():
                    await anyio.sleep(0.5)
                    elapsed = time.time() - start
                    if live:
                        live.update(_render(progress, procs, elapsed))
                    elif time.time() - last_line > 15:
                        last_line = time.time()
                        snap = progress.snapshot()
                        console.print(
                            f"[{elapsed / 60:5.1f} min] policy v{snap['policy_version']} reward v{snap['reward_version']} "
                            f"success {snap['success_rate']:.2f} judged {snap['trajectories']} "
                            f"trained {snap['samples_trained']} active {snap['tasks_active']} "
                            f"pending {snap['tasks_pending']} acc/rej {snap['variants_accepted']}/"
                            f"{snap['variants_rejected']} dlq {snap['dlq']}"
                        )
                    if broker is not None and time.time() - last_usage > 15:
                        last_usage = time.time()
                        _broker_usage(broker, progress)
                    if start_version is None and progress.versions:
                        start_version = progress.versions.get("policy", 0)
                    if deadline and time.time() >= deadline:
                        break
                    if options.updates is not None and start_version is not None:
                        if progress.versions.get("policy", 0) - start_version >= options.updates:
                            break
                    if broker is not None and not broker.alive():
                        if not broker.durable:
                            console.print("the in-memory broker died: an ephemeral run cannot resume")
                            exit_code = 1
                            break
                        _restart_broker(broker, console, "broker died")
                    elif (
                        broker is not None
                        and broker.durable
                        and time.time() - last_probe > watch.probe_every_s
                    ):
                        last_probe = time.time()
                        answered = await anyio.to_thread.run_sync(broker.answers)
                        if watch.restart_now(answered, time.time()):
                            why = f"broker runs but has not answered for {watch.unresponsive_s:.0f} s"
                            _restart_broker(broker, console, why)
                    if not await _supervise(procs, options.restarts, env, broker_bootstrap=bootstrap,
                                            console=console):  # fmt: skip
                        exit_code = 1
                        break
            finally:
                if live:
                    live.stop()
                console.print("stopping roles (SIGTERM, then SIGKILL after the grace period)")
                with anyio.CancelScope(shield=True):
                    await _stop(procs, options.grace_s)
                if broker is not None:
                    _broker_usage(broker, progress)
                shutdown.set()
                followed.set()  # each reader reads on to the topic's end, then the task group ends
                tg.cancel_scope.deadline = anyio.current_time() + 60.0
        board.close()

        from app.report import write_report

        index = write_report(progress, workdir / "report", title=f"forgestream run — {workdir.name}")
        snap = progress.snapshot()
        console.print(
            f"done: policy v{snap['policy_version']}, reward v{snap['reward_version']}, "
            f"{snap['trajectories']} trajectories judged, success {snap['success_rate']:.2f}"
        )
        if snap["cpu_s"]:
            cpu = ", ".join(f"{p} {s:.0f}" for p, s in sorted(snap["cpu_s"].items(), key=lambda x: -x[1]))
            console.print(f"CPU seconds: {cpu}")
        console.print(f"report: {index}")
        return exit_code
    finally:
        if broker is not None:
            await anyio.to_thread.run_sync(broker.stop)
