"""Embedded broker: start/stop without orphans, clear errors, durable mode survives kill -9, CLI."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from infra.broker import Broker, BrokerError, free_port, metadata_ok
from infra.bus import Bus, Record
from infra.topics import create_topics, list_topics
from schemas import events as ev
from schemas import topics as T
from schemas.config import KafkaConfig
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "app.cli"]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie is gone for our purposes (its parent has not reaped it yet)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_start_stop_leaves_no_process() -> None:
    with Broker() as b:
        assert metadata_ok(b.host, b.port)
        pids = b.pids
        assert set(pids) == {"tansu"}
    assert all(gone(p) for p in pids.values())
    assert not metadata_ok(b.host, b.port, timeout_s=0.3)


def test_port_taken_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(BrokerError, match=f"port {port} .* already in use"):
            Broker(port=port).start()


def test_missing_binaries_are_clear_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FORGESTREAM_TANSU", str(tmp_path / "no-tansu"))
    with pytest.raises(BrokerError, match="FORGESTREAM_TANSU.*not an executable"):
        Broker().start()
    monkeypatch.delenv("FORGESTREAM_TANSU")
    monkeypatch.setenv("FORGESTREAM_S3RVER", str(tmp_path / "no-s3rver"))
    with pytest.raises(BrokerError, match="FORGESTREAM_S3RVER.*does not exist"):
        Broker(durable=True, data_dir=tmp_path / "data").start()


def test_broker_dies_with_its_parent() -> None:
    """kill -9 of the process that started the broker must not leave an orphan broker."""
    code = (
        "from infra.broker import Broker; b = Broker().start(); print(b.pids['tansu'], flush=True); input()"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True
    )
    try:
        tansu_pid = int(parent.stdout.readline())
        assert not gone(tansu_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(5)
        wait_for(lambda: gone(tansu_pid), 5, "the orphaned broker to die", interval_s=0.05)
    finally:
        parent.kill()


def start_supervised(child: str) -> tuple[subprocess.Popen, int]:
    """A stand-in for `up`: a process that starts `child` (Python code) with FORGESTREAM_SUPERVISOR set
    to its own pid, its output on the supervisor's stderr; returns the supervisor and the child's pid
    once the child printed 'ready'."""
    supervisor = (
        "import os, subprocess, sys; c = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=sys.stderr, "
        "env=os.environ | {'FORGESTREAM_SUPERVISOR': str(os.getpid())}); print(c.pid, flush=True); input()"
    )
    parent = subprocess.Popen([sys.executable, "-c", supervisor, child], cwd=ROOT, stdout=subprocess.PIPE,
                              stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    role_pid = int(parent.stdout.readline())
    assert parent.stderr.readline() == "ready\n"
    return parent, role_pid


def test_a_role_started_by_up_stops_when_up_is_killed() -> None:
    """`up` hands its pid to each role (FORGESTREAM_SUPERVISOR); the role asks for SIGTERM when its
    parent dies, so a kill -9 of `up` drains the roles instead of orphaning them."""
    parent, role_pid = start_supervised(
        "import signal, time; from infra.broker import die_with_parent; die_with_parent(signal.SIGTERM); "
        "print('ready', flush=True); time.sleep(120)"
    )
    try:
        assert not gone(role_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(5)
        wait_for(lambda: gone(role_pid), 10, "the role of a killed supervisor to stop", interval_s=0.05)
    finally:
        parent.kill()
    # a role whose supervisor is already gone (it is not our parent) refuses to start
    orphan = subprocess.run([*CLI, "run", "scheduler"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env=os.environ | {"FORGESTREAM_SUPERVISOR": "1"})  # fmt: skip
    assert orphan.returncode == 1 and "supervisor (pid 1) is gone" in orphan.stderr


def test_a_role_whose_up_died_exits_after_the_grace_even_if_its_drain_hangs(tmp_path: Path) -> None:
    """kill -9 of `up` takes its embedded broker along: its roles get SIGTERM and drain against a dead
    broker, with nobody left to SIGKILL them after the grace. A role exits by itself then, whatever its
    drain waits on (here: a SIGTERM handler that never returns), and says why."""
    log_path = tmp_path / "role.log"
    parent, role_pid = start_supervised(
        "import logging, signal, sys, time; from app.cli import stop_with_supervisor\n"
        f"logging.basicConfig(filename={str(log_path)!r})\n"
        "signal.signal(signal.SIGTERM, lambda *_: print('draining', flush=True) or time.sleep(3600))\n"
        "stop_with_supervisor('judge', grace_s=2.0); print('ready', flush=True); time.sleep(3600)"
    )
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait(5)
        assert parent.stderr.readline() == "draining\n"  # SIGTERM came, and the drain hangs
        wait_for(
            lambda: gone(role_pid), 15, "a role whose drain hangs to exit after its grace", interval_s=0.05
        )
    finally:
        parent.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(role_pid, signal.SIGKILL)
    assert "role judge: its supervisor" in log_path.read_text()
    assert "did not end within 2 s; exiting" in log_path.read_text()


def test_one_up_per_workdir_and_the_config_file_names_it(tmp_path: Path) -> None:
    """A second `up` on a held run folder fails at once, naming the folder and the holder; the folder is
    the config file's `workdir` when --workdir is not given; a killed holder leaves no stale lock."""
    from app.run_folder import WorkdirInUse, hold_workdir, workdir_held

    workdir = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(f'workdir = "{workdir}"\n')
    with hold_workdir(workdir):
        assert workdir_held(workdir)
        with pytest.raises(WorkdirInUse, match=f"pid {os.getpid()}"):
            with hold_workdir(workdir):
                pass
        started = time.monotonic()
        second = run_cli("up", "--config", str(config), "--ephemeral", "--minutes", "1", timeout=60)
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"{workdir} is in use by another forgestream process (pid {os.getpid()}" in second.stderr
        assert time.monotonic() - started < 30  # before any broker or model starts
        assert not (workdir / "broker.json").exists()
    assert not workdir_held(workdir)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from app.run_folder import hold_workdir\n"
         "with hold_workdir(Path(sys.argv[1])): print('held', flush=True); input()", str(workdir)],
        cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        assert workdir_held(workdir)
        holder.send_signal(signal.SIGKILL)
        holder.wait(5)
        assert not workdir_held(workdir)
    finally:
        holder.kill()


@pytest.mark.timeout(120)
async def test_reading_a_stopped_run_holds_its_folder_while_its_broker_runs(tmp_path: Path) -> None:
    """`status` / `report` on a stopped durable run start a broker on its data; meanwhile they hold the
    folder, so an `up` (or another reader) cannot start a second broker on the same data."""
    from app.run_folder import WorkdirInUse, hold_workdir, kafka_for, record_broker, workdir_held

    workdir = tmp_path / "run"
    with Broker(durable=True, data_dir=workdir / "broker") as first:
        await create_topics(KafkaConfig(bootstrap=first.bootstrap))
        record_broker(workdir, first.bootstrap, durable=True)
    async with kafka_for(KafkaConfig(), bootstrap=None, workdir=workdir) as kafka:
        async with Bus(kafka, role="test") as bus:  # its broker answers on the run's data
            await bus.send(T.TASKS, request(0).task, key="t0")
            assert [r.value.task_id for r in await bus.read_topic(T.TASKS)] == ["t0"]
        assert workdir_held(workdir)
        with pytest.raises(WorkdirInUse, match=f"pid {os.getpid()}"):
            with hold_workdir(workdir):
                pass
        with pytest.raises(BrokerError, match="never started"):
            async with kafka_for(KafkaConfig(), bootstrap=None, workdir=workdir):
                pass
    assert not workdir_held(workdir)


def request(i: int) -> ev.RolloutRequest:
    spec = ev.TaskSpec(task_id=f"t{i}", domain="code", difficulty=0, params={}, seed=i)
    return ev.RolloutRequest(request_id=f"r{i}", task=spec, n=4)


async def test_durable_mode_survives_kill_9_of_broker_and_store(tmp_path: Path) -> None:
    port = free_port()
    kafka = KafkaConfig(bootstrap=f"127.0.0.1:{port}", session_timeout_s=6.0, heartbeat_interval_s=0.5)
    handled: list[str] = []

    async def consume(bus: Bus, count: int) -> None:
        done = anyio.Event()
        target = len(handled) + count

        async def handler(record: Record[ev.RolloutRequest]) -> None:
            handled.append(record.value.request_id)
            if len(handled) >= target:
                done.set()

        with anyio.fail_after(30):
            await bus.consume([T.ROLLOUT_REQUESTS], group="durable", handler=handler, shutdown=done)

    broker = Broker(port=port, durable=True, data_dir=tmp_path).start()
    try:
        assert set(broker.pids) == {"tansu", "s3rver"}
        await create_topics(kafka)
        async with Bus(kafka, role="test") as bus:
            await bus.send_many(T.ROLLOUT_REQUESTS, [(f"k{i % 4}", request(i)) for i in range(40)])
            await consume(bus, 15)  # commits what it handled, on shutdown
        broker.kill()  # SIGKILL broker and s3rver, no grace
        broker = Broker(port=port, durable=True, data_dir=tmp_path).start()
        assert T.ROLLOUT_REQUESTS in await list_topics(kafka)
        async with Bus(kafka, role="test") as bus:
            everything = await bus.read_topic(T.ROLLOUT_REQUESTS)
            assert sorted(r.value.request_id for r in everything) == sorted(f"r{i}" for i in range(40))
            await consume(bus, 40 - 15)  # the group resumes at its commit
        assert sorted(handled) == sorted(f"r{i}" for i in range(40))  # nothing lost, nothing twice
    finally:
        broker.stop()


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_cli_broker_runs_in_foreground_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [*CLI, "broker", "--port", str(port), "--data", str(tmp_path)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: metadata_ok("127.0.0.1", port, timeout_s=0.3), 20, "the CLI broker", interval_s=0.05)
        taken = run_cli("broker", "--port", str(port))
        assert taken.returncode == 2 and "already in use" in taken.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        proc.kill()
    assert not metadata_ok("127.0.0.1", port, timeout_s=0.3)


def test_cli_topics_and_fail_fast(broker: Any) -> None:
    prefix = f"cli{os.getpid()}."
    created = run_cli("topics", "create", "--bootstrap", broker.bootstrap, "--topic-prefix", prefix)
    assert created.returncode == 0, created.stderr
    assert f"created {len(T.TOPICS)} topic(s)" in created.stdout
    again = run_cli("topics", "create", "--bootstrap", broker.bootstrap, "--topic-prefix", prefix)
    assert "created 0 topic(s)" in again.stdout
    listed = run_cli("topics", "list", "--bootstrap", broker.bootstrap, "--topic-prefix", prefix)
    assert listed.stdout.split() == [prefix + name for name in T.TOPICS]

    unreachable = run_cli("run", "judge", "--bootstrap", f"127.0.0.1:{free_port()}")
    assert unreachable.returncode == 2
    assert unreachable.stderr.strip().count("\n") == 0 and "no Kafka broker reachable" in unreachable.stderr
    bad = run_cli("run", "judge", "--bootstrap", broker.bootstrap, "--config", "/nonexistent.toml")
    assert bad.returncode == 2 and "/nonexistent.toml does not exist" in bad.stderr
    unknown = run_cli("run", "oracle")
    assert unknown.returncode == 2 and "unknown role 'oracle'" in unknown.stderr


def test_cli_help_is_fast_and_does_not_import_torch() -> None:
    code = "import sys; sys.argv=['forgestream','--help']; import app.cli as c\ntry: c.main()\nexcept SystemExit: pass\nprint('torch' in sys.modules, 'aiokafka' in sys.modules)"
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "False False"
    assert time.monotonic() - started < 10
