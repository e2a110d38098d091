"""forge: per-task accuracy windows -> harder/easier requests and verdicts on pending variants.

A faust-streaming app (app id and consumer group = kafka.topic_prefix + forge.app_id), started in the
caller's event loop (`app.start()` / `app.stop()`; faust runs its Kafka consumer in its own thread).
Consumes `forge.trajectories.judged` (raw bytes, decoded with msgspec), repartitioned by task_id into
a faust Table of accuracy windows (changelog-backed: a restarted forge resumes half-filled windows);
follows `forge.tasks` without a group (every member needs every task's status and pending children).
Produces on `forge.task.events`: harder/easier (with CriticFeedback) for an active task whose window
holds `forge.window` rollouts and whose accuracy crosses the thresholds, only if it has no pending
child (and not twice within `forge.event_cooldown_s`); accepted/rejected for a pending variant.
On `forge.tasks`: accepted -> variant active (version + 1) and its parent retired (version + 1);
rejected -> variant retired (version + 1). Metrics forge/task_events, forge/accepted, forge/rejected,
forge/tasks_active, forge/tasks_pending.

Invariants: a trajectory counts at most once per window (keys of the window and of recent windows are
kept in the table entry, so redeliveries after a crash are ignored); outputs are acknowledged by the
broker before the agent finishes the event, and faust commits the offset only after that
(at-least-once; `exactly_once` needs transactions, which Tansu lacks). Window decisions are a pure
function (`decide`) of the window and the task's current spec.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import faust
import msgspec
from faust.streams import current_event
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery

import algorithm
from infra.bus import Bus, FatalError, client_options, redriven_elsewhere
from pipeline.taskpool import TaskPool, follow_tasks, restore_tasks
from schemas import codec
from schemas.config import ForgeConfig, KafkaConfig, RunConfig
from schemas.events import CriticFeedback, JudgedTrajectory, TaskEvent, TaskSpec
from schemas.topics import JUDGED, TASK_EVENTS, TASKS

log = logging.getLogger("forgestream.forge")
TABLE = "windows"
_TEXT = 200  # characters kept per action / pattern in the critic feedback


# --- pure part: window entries (JSON-able dicts in the table) and decisions ---
def window_entry(judged: JudgedTrajectory) -> dict[str, Any]:
    """What the window keeps of one judged rollout: outcome, high-risk steps and their responses."""
    trajectory = judged.trajectory
    verdicts = [s.verdicts for s in judged.steps]
    risky = [
        trajectory.steps[i].index for i in algorithm.high_risk_steps(verdicts) if i < len(trajectory.steps)
    ]
    by_index = {s.index: s.response for s in trajectory.steps}
    return {
        "key": judged.key,
        "outcome": trajectory.outcome,
        "risk": risky if trajectory.outcome < 0 else [],
        "actions": [by_index[i][:_TEXT] for i in risky] if trajectory.outcome < 0 else [],
        "pattern": " | ".join(s.response for s in trajectory.steps)[:_TEXT] if trajectory.outcome > 0 else "",
    }


def empty_window() -> dict[str, Any]:
    return {"rollouts": [], "recent": [], "decisions": 0, "last_event_at": 0.0}


def critic(rollouts: list[dict[str, Any]]) -> CriticFeedback:
    failed = [r for r in rollouts if r["outcome"] < 0]
    return CriticFeedback(
        high_risk_steps=[r["risk"] for r in failed],
        failed_actions=[a for r in failed for a in r["actions"]],
        success_patterns=[r["pattern"] for r in rollouts if r["outcome"] > 0],
    )


@dataclass(frozen=True)
class Decision:
    event: TaskEvent | None = None
    updates: tuple[TaskSpec, ...] = ()  # new TaskSpecs for forge.tasks, in publishing order


def decide(
    spec: TaskSpec, window: dict[str, Any], tasks: dict[str, TaskSpec], config: ForgeConfig, now: float
) -> Decision:
    """What a full window of `spec` leads to (pure; `tasks` is the current view of forge.tasks)."""
    rollouts = window["rollouts"]
    acc = algorithm.group_accuracy([r["outcome"] for r in rollouts])
    event_id = f"{spec.task_id}/{window['decisions']}"
    base = {"task_id": spec.task_id, "accuracy": acc, "rollouts": len(rollouts), "parent_id": spec.parent_id}
    if spec.status == "pending":
        ok = (
            spec.direction is not None
            and spec.parent_accuracy is not None
            and algorithm.accept(spec.direction, spec.parent_accuracy, acc, config.high, config.low)
        )
        kind = "accepted" if ok else "rejected"
        event = TaskEvent(event_id=f"{event_id}/{kind}", task_version=spec.version, kind=kind, **base)
        variant = msgspec.structs.replace(
            spec, status="active" if ok else "retired", version=spec.version + 1
        )
        parent = tasks.get(spec.parent_id or "")
        if ok and parent is not None and parent.status != "retired":
            retired = msgspec.structs.replace(parent, status="retired", version=parent.version + 1)
            return Decision(event, (variant, retired))
        return Decision(event, (variant,))
    if spec.status != "active":
        return Decision()
    kind = algorithm.direction(acc, config.high, config.low)
    pending_child = any(t.status == "pending" and t.parent_id == spec.task_id for t in tasks.values())
    cooling = now - window["last_event_at"] < config.event_cooldown_s
    if kind is None or pending_child or cooling:
        return Decision()
    event = TaskEvent(
        event_id=f"{event_id}/{kind}", task_version=spec.version, kind=kind, critic=critic(rollouts), **base
    )
    return Decision(event)


# --- the faust app ---
def _brokers(kafka: KafkaConfig) -> list[str]:
    return [f"kafka://{host.strip()}" for host in kafka.bootstrap.split(",") if host.strip()]


def _credentials(kafka: KafkaConfig) -> Any:
    """faust's credentials from the bus's own connection options (one reading of the security settings)."""
    if kafka.security_protocol == "PLAINTEXT":
        return None
    opts = client_options(kafka)
    if kafka.security_protocol == "SSL":
        return faust.SSLCredentials(opts["ssl_context"])
    return faust.SASLCredentials(
        username=opts["sasl_plain_username"],
        password=opts["sasl_plain_password"],
        mechanism=opts["sasl_mechanism"],
        ssl_context=opts.get("ssl_context"),
    )


class FlowStoppedRecovery(Recovery):
    """faust's recovery, with the consumer's flow stopped while the stream partitions are sought.

    After a restore faust resumes and seeks the stream partitions with the flow still on from reading the
    changelog, and only then resumes its flow control, which clears the stream queues: a record delivered
    in between was dropped unprocessed, its offset passed (seen here: a forge restarted with a backlog lost
    the backlog's first rollout). With the flow stopped nothing is delivered until after that clear.
    """

    logger = logging.getLogger("faust.forge.recovery")  # under faust's logger: quiet like the rest of it

    async def on_recovery_completed(self, generation_id: int = 0) -> None:
        self.app.consumer.stop_flow()
        await super().on_recovery_completed(generation_id)


class ForgeTables(TableManager):
    logger = logging.getLogger("faust.forge.tables")

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = FlowStoppedRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery


class Forge:
    """The faust app, its accuracy-window table, and the outputs it publishes through the Bus."""

    def __init__(self, config: RunConfig, bus: Bus) -> None:
        self.config = config
        self.settings = config.forge
        self.bus = bus
        self.view = TaskPool()  # the newest spec per task: forge.tasks plus our own publications
        kafka = config.kafka
        datadir = Path(config.workdir) / "forge-data"  # faust's own folder: in the run, not the cwd
        datadir.parent.mkdir(parents=True, exist_ok=True)
        self.app = faust.App(
            kafka.topic_prefix + self.settings.app_id,
            broker=_brokers(kafka),
            broker_credentials=_credentials(kafka),
            broker_session_timeout=kafka.session_timeout_s,
            broker_heartbeat_interval=kafka.heartbeat_interval_s,
            broker_request_timeout=max(kafka.request_timeout_s, kafka.session_timeout_s + 5),
            broker_max_poll_interval=kafka.max_poll_interval_s,
            producer_max_request_size=kafka.max_message_bytes,
            consumer_max_fetch_size=kafka.max_message_bytes,
            # Tansu answers ListOffsets(latest) with the first offset of the LAST BATCH + 1, and faust
            # restores a changelog only up to that offset: a batch of several table updates would lose
            # all but its first on restart. One record per batch keeps that answer exact.
            producer_max_batch_size=1,
            processing_guarantee="at_least_once",  # exactly_once needs transactions (not on Tansu)
            store="memory://",  # rebuilt from the changelog topic on start
            topic_partitions=self.settings.partitions,
            web_enabled=False,
            autodiscover=False,
            datadir=str(datadir),
            TableManager=ForgeTables,
        )
        self.table = self.app.Table(TABLE, default=None, partitions=self.settings.partitions)
        judged = self.app.topic(bus.names.of(JUDGED), key_serializer="raw", value_serializer="raw")
        self.app.agent(judged, name="forge-judged")(self._agent)

    async def _task_key(self, raw: bytes) -> str:
        """The repartition key. It runs on the source stream, where the record still has its partition
        and offset: an undecodable record goes to the DLQ with them here, and on under the key "", as
        does a record redriven for another group (the forge had counted the original)."""
        event = current_event()
        if event is None:  # faust calls a group_by key inside its stream, where an event is current
            raise FatalError("the forge's repartition key ran outside a stream event")
        if redriven_elsewhere(event.message.headers, self.app.conf.id):
            return ""
        try:
            return codec.decode(raw, JudgedTrajectory).trajectory.task.task_id
        except (*codec.DecodeError, TypeError) as e:  # TypeError: a null value
            await self.bus.dead_letter(event.message, f"decode: {e}", group=self.app.conf.id)
            return ""

    async def _agent(self, stream: Any) -> None:
        by_task = stream.group_by(self._task_key, name="by-task", partitions=self.settings.partitions)
        async for key, raw in by_task.items():
            if key:  # "": dead-lettered, or redriven for another group, above
                await self.observe(codec.decode(raw, JudgedTrajectory))

    async def observe(self, judged: JudgedTrajectory) -> None:
        """Add one rollout to its task's window; decide when the window is full."""
        task = judged.trajectory.task
        self.view.update(task)  # the embedded spec, if the follower has not seen it yet
        window = self.table.get(task.task_id) or empty_window()
        if judged.key in window["recent"] or any(r["key"] == judged.key for r in window["rollouts"]):
            return  # redelivered
        window["rollouts"].append(window_entry(judged))
        if len(window["rollouts"]) >= self.settings.window:
            spec = self.view.tasks[task.task_id]
            decision = decide(spec, window, self.view.tasks, self.settings, time.time())
            await self._publish(decision)
            keys = [r["key"] for r in window["rollouts"]]
            window["recent"] = (window["recent"] + keys)[-4 * self.settings.window :]
            window["rollouts"] = []
            window["decisions"] += 1
            if decision.event is not None and decision.event.kind in ("harder", "easier"):
                window["last_event_at"] = time.time()
        self.table[task.task_id] = window

    async def _publish(self, decision: Decision) -> None:
        for spec in decision.updates:
            await self.bus.send(TASKS, spec, key=spec.task_id)
            self.view.update(spec)
        if decision.updates:
            await self.publish_task_gauges()
        event = decision.event
        if event is None:
            return
        await self.bus.send(TASK_EVENTS, event, key=event.task_id)
        log.info("task %s: %s (accuracy %.3f)", event.task_id, event.kind, event.accuracy)
        await self.bus.metric("forge/task_events", 1.0, kind=event.kind)
        if event.kind in ("accepted", "rejected"):
            await self.bus.metric(f"forge/{event.kind}", 1.0)

    async def publish_task_gauges(self) -> None:
        """Metrics forge/tasks_active and forge/tasks_pending, after the task view changed."""
        await self.bus.metric("forge/tasks_active", float(self.view.count("active")))
        await self.bus.metric("forge/tasks_pending", float(self.view.count("pending")))


@contextlib.asynccontextmanager
async def running(config: RunConfig) -> AsyncIterator[Forge]:
    """Start the forge app in this event loop; stop it (flushing its changelog) on exit."""
    stop_follower = anyio.Event()
    if not log.isEnabledFor(logging.DEBUG):  # faust/mode narrate every service start at INFO
        for name in ("faust", "mode"):
            logging.getLogger(name).setLevel(logging.WARNING)
    async with Bus(config.kafka, role="forge") as bus, anyio.create_task_group() as tg:
        forge = Forge(config, bus)
        await restore_tasks(bus, forge.view)  # know every task before the first decision
        tg.start_soon(follow_tasks, bus, forge.view, stop_follower, forge.publish_task_gauges)
        await forge.app.start()
        try:
            yield forge
        finally:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(Exception):
                    await forge.app.producer.flush()  # table changelog writes
                await forge.app.stop()
                stop_follower.set()


async def run(config: RunConfig, *, shutdown: anyio.Event | None = None) -> None:
    """Run the forge app until `shutdown` is set; raise if faust crashed."""
    shutdown = shutdown or anyio.Event()
    async with running(config) as forge, anyio.create_task_group() as tg:

        async def until_app_stops() -> None:
            await forge.app.wait_until_stopped()
            tg.cancel_scope.cancel()

        tg.start_soon(until_app_stops)
        await shutdown.wait()
        tg.cancel_scope.cancel()
    if forge.app.crash_reason is not None:
        raise RuntimeError(f"forge app crashed: {forge.app.crash_reason!r}") from forge.app.crash_reason
