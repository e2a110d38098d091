"""Adding an actor process: the `actors` group rebalances onto the newcomer, both produce, and no
request is run twice beyond what was in flight at the rebalance.

Only the actors run here (a deep backlog of requests, no judge or learners), generating with the stub
backend (a fixed wall time per batch, no CPU). How the rate scales with actors is a benchmark
(benchmarks/actor_scaling.py), not an assertion.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs import get_environment
from infra.bus import Bus
from schemas import topics
from schemas.config import KafkaConfig
from schemas.events import RolloutRequest
from tests.conftest import TEST_PRESETS, run_sync, wait_for
from tests.test_e2e import ROOT, env_for_tests

ACTOR_CONFIG = """
[kafka]
session_timeout_s = 6.0
heartbeat_interval_s = 0.5

[actor]
parallel_episodes = 8
max_steps = 8

""" + TEST_PRESETS.read_text().replace(  # the stub still reads the preset's tokenizer
    "[policy_model]\n", '[policy_model]\nbackend = "stub"\nstub_step_s = 0.05\n'
)
WINDOW_S = 10.0
WARMUP_S = 5.0


def trajectories(kafka: KafkaConfig) -> list[tuple[float, str, str]]:
    async def read() -> list[tuple[float, str, str]]:
        async with Bus(kafka, role="probe") as bus:
            records = await bus.read_topic(topics.TRAJECTORIES)
        return [(r.timestamp_ms / 1000.0, r.value.actor_id, r.value.key) for r in records]

    return run_sync(read())


def count_in(rows: list[tuple[float, str, str]], start: float, end: float) -> int:
    return sum(start <= t < end for t, _, _ in rows)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_second_actor_gets_partitions_and_throughput_rises(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    config = tmp_path / "actor.toml"
    config.write_text(ACTOR_CONFIG)
    env_name = get_environment("household")
    rng = random.Random(3)
    # Requests keyed by request id spread the backlog over every partition; 8000 rollouts outlast
    # both windows (~40 rollouts/s per actor at 0.05 s per batch of 8).
    tasks = [env_name.sample_task(0, rng) for _ in range(200)]
    requests = [RolloutRequest(request_id=f"scale-{i}", task=tasks[i % len(tasks)], n=4) for i in range(2000)]

    async def publish() -> None:
        async with Bus(kafka_config, role="test") as bus:
            await bus.send_many(topics.ROLLOUT_REQUESTS, [(r.request_id, r) for r in requests])

    run_sync(publish())
    argv = [
        sys.executable, "-m", "app.cli", "run", "actor", "--bootstrap", kafka_config.bootstrap,
        "--topic-prefix", kafka_config.topic_prefix, "--workdir", str(tmp_path / "run"), "--config", str(config),
    ]  # fmt: skip
    procs: list[subprocess.Popen] = []
    try:
        procs.append(
            subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env_for_tests(),
                stdout=open(tmp_path / "a1.log", "wb"),
                stderr=subprocess.STDOUT,
            )
        )
        first = wait_for(lambda: trajectories(kafka_config), 180, "the first actor's first rollout")
        t0 = min(t for t, _, _ in first) + WARMUP_S
        time.sleep(max(0.0, t0 + WINDOW_S - time.time()) + 1)
        alone = count_in(trajectories(kafka_config), t0, t0 + WINDOW_S) / WINDOW_S

        procs.append(
            subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env_for_tests(),
                stdout=open(tmp_path / "a2.log", "wb"),
                stderr=subprocess.STDOUT,
            )
        )
        tag = f"-{procs[1].pid}-"
        joined = wait_for(
            lambda: [t for t, a, _ in trajectories(kafka_config) if tag in a],
            180,
            "the second actor's first rollout",
        )
        t2 = min(joined) + WARMUP_S
        time.sleep(max(0.0, t2 + WINDOW_S - time.time()) + 1)
        rows = trajectories(kafka_config)
        together = count_in(rows, t2, t2 + WINDOW_S) / WINDOW_S
        per_actor = {a for t, a, _ in rows if t2 <= t < t2 + WINDOW_S}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert alone > 0 and together > 0
    assert len(per_actor) == 2, f"both actors should produce rollouts in the second window, got {per_actor}"
    # At-least-once: a rebalance may re-run what was in flight on a moved partition (downstream
    # consumers dedupe by trajectory key), but never more than the in-flight episodes.
    keys = [k for _, _, k in rows]
    assert len(keys) - len(set(keys)) <= 2 * 8, "more rollouts re-run than were in flight at the rebalance"
    print(f"actor scaling: {alone:.2f}/s alone -> {together:.2f}/s with two ({together / alone:.2f}x)")
