"""`forgestream dlq list | redrive` on the real broker: a letter goes back to the group that
dead-lettered it, once; other groups and group-less readers skip the copy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio

from app.status import collect_status
from infra.bus import BatchConsumer, Bus, Record
from schemas import events as ev
from schemas import topics as T
from schemas.config import KafkaConfig
from tests.test_bus import request

ROOT = Path(__file__).resolve().parent.parent


def dlq_cli(kafka: KafkaConfig, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "dlq", *args, "--bootstrap", kafka.bootstrap]
        + ["--topic-prefix", kafka.topic_prefix],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def handle_until(bus: Bus, group: str, last: str, handler: Any = None) -> list[str]:
    """Consume ROLLOUT_REQUESTS with `group` until request `last` was handled; the ids handled, in order."""
    seen: list[str] = []
    done = anyio.Event()

    async def handle(record: Record[ev.RolloutRequest]) -> None:
        if handler is not None:
            await handler(record)
        seen.append(record.value.request_id)
        if record.value.request_id == last:
            done.set()

    with anyio.fail_after(30):
        await bus.consume([T.ROLLOUT_REQUESTS], group=group, handler=handle, shutdown=done)
    return seen


async def test_a_redriven_letter_reaches_only_its_group_and_only_once(kafka_config: KafkaConfig) -> None:
    async with Bus(kafka_config, role="test") as bus:
        await bus.send_many(T.ROLLOUT_REQUESTS, [("one-key", request(1)), ("one-key", request(2))])

        async def buggy(record: Record[ev.RolloutRequest]) -> None:
            if record.value.request_id == "r1":
                raise RuntimeError("bug in the handler")

        assert await handle_until(bus, "g-buggy", "r2", buggy) == ["r2"]  # r1 went to the DLQ
        assert await handle_until(bus, "g-fine", "r2") == ["r1", "r2"]
        # a letter whose value did not fit the DLQ cannot be redriven
        truncated = ev.DeadLetter(
            source_topic=bus.names.of(T.TRAJECTORIES), partition=0, offset=9, key=None, value=b"x",
            error="decode: too big (value truncated from 9000000 bytes)", group="judges",
        )  # fmt: skip
        await bus.send(T.DLQ, truncated, key=truncated.source_topic)

    listed = dlq_cli(kafka_config, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(r["dlq_offset"], r["group"], r["redriven_to"]) for r in rows] == [
        (0, "g-buggy", None),
        (1, "judges", None),
    ]
    assert (
        rows[0]["source"].startswith("forge.rollout.requests[") and "bug in the handler" in rows[0]["error"]
    )

    dry = json.loads(dlq_cli(kafka_config, "redrive", "--dry-run").stdout)
    assert [r["dlq_offset"] for r in dry["redriven"]] == [0] and dry["dry_run"]
    assert [(r["dlq_offset"], r["why"]) for r in dry["skipped"]] == [
        (1, "its value was truncated to fit the DLQ")
    ]

    done = dlq_cli(kafka_config, "redrive", "--group", "g-buggy")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["selected"] == 1 and summary["skipped"] == [] and not summary["dry_run"]
    (sent,) = summary["redriven"]
    copy_offset = sent["redriven_to"]
    assert copy_offset > 0  # after the original r1 and r2 on their one partition

    async with Bus(kafka_config, role="test") as bus:
        await bus.send(T.ROLLOUT_REQUESTS, request(3), key="one-key")  # the positive marker
        assert await handle_until(bus, "g-buggy", "r3") == ["r1", "r3"]  # the fixed handler gets r1 back
        assert await handle_until(bus, "g-fine", "r3") == ["r3"]  # it had handled the original
        assert bus.stats["not_ours"] == 1
        async with BatchConsumer(bus, [T.ROLLOUT_REQUESTS], group="g-batch") as batch:
            got: list[str] = []
            with anyio.fail_after(30):
                while "r3" not in got:
                    got += [r.value.request_id for r in await batch.next_batch(100, 1.0)]
        assert got == ["r1", "r2", "r3"]
        assert [r.value.request_id for r in await bus.read_topic(T.ROLLOUT_REQUESTS)] == ["r1", "r2", "r3"]
        assert (await collect_status(kafka_config))["redriven"] == 1
        (journal,) = [r.value for r in await bus.read_topic(T.REDRIVEN)]
        assert (journal.dlq_offset, journal.to_offset, journal.group) == (0, copy_offset, "g-buggy")

    twice = json.loads(dlq_cli(kafka_config, "redrive", "--offsets", "0").stdout)
    assert twice["redriven"] == [] and twice["skipped"][0]["why"].startswith("redriven already")
    listed = [
        json.loads(line)
        for line in dlq_cli(kafka_config, "list", "--json", "--offsets", "0-").stdout.splitlines()
    ]
    assert [r["redriven_to"] for r in listed] == [copy_offset, None]


def test_bad_flags_fail_naming_the_flag(kafka_config: KafkaConfig) -> None:
    for args, flag in ((["--offsets", "5-2"], "--offsets"), (["--topic", "forge.nope"], "--topic")):
        out = dlq_cli(kafka_config, "redrive", *args)
        assert out.returncode == 2 and f"forgestream: {flag}:" in out.stderr, out.stderr
