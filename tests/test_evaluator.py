"""Evaluator role against the real broker: held-out metrics per policy and reward version."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from consumers import evaluator
from infra.bus import Bus
from schemas import topics
from schemas.config import EvaluatorConfig, ModelConfig, RunConfig, SchedulerConfig
from tests.conftest import wait_records

POLICY = ModelConfig(bootstrap_sft_seconds=5, max_new_tokens=8)
REWARD = ModelConfig(bootstrap_sft_seconds=5, max_new_tokens=8)


@pytest.fixture
def model_home(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    if not os.environ.get("FORGESTREAM_HOME"):
        monkeypatch.setenv("FORGESTREAM_HOME", str(tmp_path_factory.getbasetemp() / "forgestream-home"))


def publish(workdir: Path, role: str, model: ModelConfig, version: int) -> Any:
    from infra.models import load_trainable
    from infra.weights import WeightStore

    net, tokenizer = load_trainable(model, role=role, workdir=workdir)  # type: ignore[arg-type]
    return WeightStore(str(workdir / "weights")).publish(role, version, net, tokenizer, preset="tiny")  # type: ignore[arg-type]


@pytest.mark.timeout(240)
async def test_evaluator_reports_every_k_versions(
    kafka_config: Any, model_home: None, tmp_path: Path
) -> None:
    config = RunConfig(
        workdir=str(tmp_path),
        kafka=kafka_config,
        policy_model=POLICY,
        reward_model=REWARD,
        scheduler=SchedulerConfig(seed_difficulty=1),
        evaluator=EvaluatorConfig(
            every_versions=2,
            tasks_per_level=3,
            max_steps=3,
            reward_steps=6,
            levels=(0, 2),
            modes=("sampled", "redraw"),
        ),
    )
    shutdown = anyio.Event()
    async with Bus(kafka_config, role="test") as bus, anyio.create_task_group() as tg:
        for role, model in (("policy", POLICY), ("reward", REWARD)):
            await bus.send(topics.WEIGHTS, publish(tmp_path, role, model, 0), key=role)
        tg.start_soon(functools.partial(evaluator.run, config, shutdown=shutdown))

        def evaluated(name: str, versions: set[int]) -> Any:
            def ok(metrics: list[Any]) -> bool:
                return {m.step for m in metrics if m.name == name} >= versions

            return ok

        await wait_records(bus, topics.METRICS, evaluated("eval/policy/success", {0}), timeout=180)
        await wait_records(bus, topics.METRICS, evaluated("eval/reward/accuracy", {0}), timeout=120)
        # v1 is not 2 past v0: skipped; v2 is evaluated
        await bus.send(topics.WEIGHTS, publish(tmp_path, "policy", POLICY, 1), key="policy")
        await bus.send(topics.WEIGHTS, publish(tmp_path, "policy", POLICY, 2), key="policy")
        metrics = await wait_records(
            bus, topics.METRICS, evaluated("eval/policy/success", {0, 2}), timeout=120
        )
        shutdown.set()
    success = [m for m in metrics if m.name == "eval/policy/success"]
    # each evaluated version, level and mode once (redraw: as the actors play, actor.redraw resolved to 8)
    assert sorted((m.step, m.labels["level"], m.labels["mode"]) for m in success) == [
        (v, level, mode) for v in (0, 2) for level in ("0", "2") for mode in ("redraw", "sampled")
    ]
    assert all(0.0 <= m.value <= 1.0 for m in success)
    for name in (
        "eval/policy/invalid_rate",
        "eval/policy/ci_low",
        "eval/policy/ci_high",
        "eval/reward/balanced_accuracy",
    ):
        assert any(m.name == name for m in metrics), name
