"""Evaluator: held-out success of the policy (and process accuracy of the reward model) as they train.

Consumes: forge.weights (follows it; nothing is committed: a restart re-evaluates what it must).
Produces: metrics on forge.metrics, step = the evaluated version:
  `eval/policy/{success,invalid_rate,ci_low,ci_high,mean_steps}` (labels level and mode: sampled, or
  redraw as the actors play, per `evaluator.modes`);
  `eval/reward/{accuracy,balanced_accuracy,said_good}` (process accuracy on fixed labelled steps).
Runs beside the loop, never in it: it loads its own copies of the weights, and when it falls behind
it skips to the newest version (at least `evaluator.every_versions` after the last one evaluated),
so it never slows an actor, a judge or a learner except by sharing the CPU.
Held-out tasks come from `envs.seeds.heldout_rng` (pipeline/evaluation.py), never from training seeds.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio

from envs import get_environment
from infra.bus import Bus
from infra.models import load_backend
from infra.weights import WeightStore, WeightsWatcher
from pipeline.evaluation import PlayedStep, evaluate_policy, play_heldout, process_accuracy
from schemas.config import RunConfig

log = logging.getLogger("forgestream.evaluator")


async def run(config: RunConfig, *, shutdown: anyio.Event | None = None) -> None:
    shutdown = shutdown or anyio.Event()
    cfg, pm, rm = config.evaluator, config.policy_model, config.reward_model
    domain = config.scheduler.domain
    band = config.scheduler.seed_difficulty
    top = get_environment(domain).levels - 1
    levels = list(cfg.levels) or sorted({min(band, top), min(band + 2, top)})
    workdir = Path(config.workdir)
    policy = await anyio.to_thread.run_sync(lambda: load_backend(pm, role="policy", workdir=workdir))
    judge = None
    if cfg.reward_steps:
        judge = await anyio.to_thread.run_sync(lambda: load_backend(rm, role="reward", workdir=workdir))
    store = WeightStore.for_run(config)
    steps: list[PlayedStep] = []  # fixed labelled steps for the reward model, played once at start

    def heldout_success() -> dict[str, dict[str, dict[str, Any]]]:
        return evaluate_policy(policy, domain, levels, cfg.tasks_per_level,
                               temperatures={mode: pm.temperature for mode in cfg.modes},
                               max_tokens=pm.max_new_tokens, max_steps=cfg.max_steps, seed=config.seed,
                               redraws={"redraw": config.actor.redraw})  # fmt: skip

    def labelled_steps() -> list[PlayedStep]:
        played = play_heldout(policy, domain, levels[0], cfg.tasks_per_level, temperature=pm.temperature,
                              max_tokens=pm.max_new_tokens, max_steps=cfg.max_steps, seed=config.seed + 1)  # fmt: skip
        labelled = [s for e in played for s in e.steps if s.progress is not None]
        good = [s for s in labelled if s.progress][: cfg.reward_steps // 2]
        bad = [s for s in labelled if not s.progress][: cfg.reward_steps - len(good)]
        return good + bad

    async with Bus(config.kafka, role="evaluator") as bus:
        policy_watch = WeightsWatcher(bus, store, "policy")
        reward_watch = WeightsWatcher(bus, store, "reward")

        async def evaluate(name: str) -> None:
            if name == "policy":
                by_mode = await anyio.to_thread.run_sync(heldout_success)
                for mode, results in by_mode.items():
                    for level, r in results.items():
                        for metric in ("success", "invalid_rate", "ci_low", "ci_high", "mean_steps"):
                            await bus.metric(f"eval/policy/{metric}", r[metric], step=policy.version,
                                             level=level, mode=mode)  # fmt: skip
                    log.info("policy v%d held-out, %s: %s", policy.version, mode,
                             {lv: round(r["success"], 3) for lv, r in results.items()})  # fmt: skip
            else:
                assert judge is not None
                out = await anyio.to_thread.run_sync(
                    lambda: process_accuracy(
                        judge,
                        steps,
                        m=config.judge.m,
                        temperature=rm.temperature,
                        max_tokens=config.judge.max_new_tokens,
                        seed=config.seed,
                    )  # fmt: skip
                )
                if out["steps"]:
                    for metric in ("accuracy", "balanced_accuracy", "said_good"):
                        await bus.metric(f"eval/reward/{metric}", out[metric], step=judge.version)
                    log.info("reward v%d process accuracy %.3f (balanced %.3f) on %d steps",
                             judge.version, out["accuracy"], out["balanced_accuracy"], out["steps"])  # fmt: skip

        async def follow(name: str, watch: WeightsWatcher, backend: Any) -> None:
            """Evaluate the newest version once it is `every_versions` past the last one evaluated
            (the first one seen, usually v0, at once); versions published meanwhile are skipped."""
            last: int | None = None
            while not shutdown.is_set():
                await watch.wait_newer_than(-1 if last is None else last + cfg.every_versions - 1)
                await anyio.to_thread.run_sync(watch.apply, backend)
                await evaluate(name)
                last = backend.version

        async with anyio.create_task_group() as tg:
            tg.start_soon(policy_watch.run, shutdown)
            tg.start_soon(follow, "policy", policy_watch, policy)
            if judge is not None:
                steps.extend(await anyio.to_thread.run_sync(labelled_steps))
                tg.start_soon(reward_watch.run, shutdown)
                tg.start_soon(follow, "reward", reward_watch, judge)
            await shutdown.wait()
            tg.cancel_scope.cancel()
