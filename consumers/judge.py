"""Judge: the reward model's m verdicts on every step of every trajectory.

Consumes: `forge.trajectories` (group "judges"), `forge.weights` through a WeightsWatcher (reward
          model versions; not loaded when `judge.follow_weights` is off).
Produces: `forge.trajectories.judged` (JudgedTrajectory, key request_id, so signals gets whole groups:
          one StepJudgement of m Judgements per step, each with its token ids, behaviour logprobs and
          text), metric `judge/judged`.
Invariant: one JudgedTrajectory per trajectory key (request_id/rollout_index), produced before the
offset is committed; redelivered trajectories are skipped by key. `reward_version` is the reward
model version that generated every judgement in it.

Verdicts (household, arith): the paper's judging prompt (envs.judging.judge_prompt) with the
episode context rebuilt by replaying the trajectory's responses in a fresh episode of its task
(`Episode.judge_context`); m samples per step from one batched generate over all steps; the last
`\\boxed{}` is the verdict (+1 / -1, 0 unparseable).

`judge.verdicts = "oracle"` / `"oracle-explore"` (ablations): the environment's own step labels stand in
for the reward model's verdicts (`oracle_steps`), no model is loaded.

Domains judged by unit tests (`Environment.judged_by`, the code domain): the reward model writes
tests instead (envs.code's test prompt). A judgement's tests are checked against the task's reference
solution (a test whose expected output the reference does not produce is invalid); the policy's
program is run on the valid ones: verdict +1 if it passes them all, -1 if it fails one, 0 if there is
no valid test. `score` is the judgement's CURE score (`algorithm.cure_test_raw` summed over its tests,
with the trajectory's program as the candidate and its outcome as that program's correctness).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import anyio

from algorithm import cure_test_raw
from envs import judge_prompt, parse_verdict, shared_environment
from envs.base import Environment, UnitTestJudged, judged_by_unit_tests
from envs.play import label_verdict, step_with_label
from envs.sandbox import SandboxUnavailable
from infra.bus import Bus, FatalError, Record
from pipeline.serving import load_serving_model
from schemas import topics
from schemas.config import RunConfig, VerdictSource
from schemas.events import JudgedTrajectory, Judgement, StepJudgement, Trajectory, wire_logprobs

log = logging.getLogger("forgestream.judge")


# --- prompts -------------------------------------------------------------------------------------
def step_contexts(env: Environment, trajectory: Trajectory) -> list[str]:
    """`judge_context(i)` for every step, by replaying the responses in a fresh episode; a step the
    replay cannot reach (world changed, episode ended early) falls back to the policy's own prompt,
    which holds the task and the history too."""
    contexts: list[str] = []
    try:
        episode = env.reset(trajectory.task)
        for step in trajectory.steps:
            if episode.done:
                break
            contexts.append(episode.judge_context(step.index))
            episode.step(step.response)
    except Exception as e:  # a replay failure only costs context quality, never the verdict
        log.warning("judge: replay of %s failed (%s); using step prompts", trajectory.key, e)
    contexts += [step.prompt for step in trajectory.steps[len(contexts) :]]
    return contexts


def verdict_prompts(env: Environment, trajectory: Trajectory) -> list[str]:
    contexts = step_contexts(env, trajectory)
    return [
        judge_prompt(context, step.response, step.observation)
        for context, step in zip(contexts, trajectory.steps, strict=True)
    ]


def judgement(completion: Any, verdict: int, score: float | None = None) -> Judgement:
    return Judgement(
        verdict=verdict,  # type: ignore[arg-type]
        prompt_token_ids=list(completion.prompt_token_ids),
        response_token_ids=list(completion.token_ids),
        behaviour_logprobs=wire_logprobs(completion.logprobs),
        text=completion.text,
        score=score,
    )


# --- code domain: unit tests instead of verdicts ----------------------------------------------------
def code_prompts(env: UnitTestJudged, trajectory: Trajectory) -> list[str]:
    return [env.unit_test_prompt(trajectory.task, step.response) for step in trajectory.steps]


def code_judgements(
    env: UnitTestJudged, trajectory: Trajectory, step_response: str, samples: list[Any]
) -> list[Judgement]:
    """Verdict and CURE score of each reward-model generation of unit tests for one step; a test
    written twice is run once (tests run in the sandbox)."""
    task = trajectory.task
    checked: dict[tuple[str, str], tuple[bool, bool]] = {}  # test -> (correct, policy program passes)

    def check(test: tuple[str, str]) -> tuple[bool, bool]:
        if test not in checked:
            checked[test] = (env.test_is_correct(task, test), env.program_passes(task, step_response, test))
        return checked[test]

    out = []
    for completion in samples:
        tests = [tuple(t) for t in env.parse_unit_tests(completion.text)]
        results = [check(t) for t in tests]
        valid = [correct for correct, _ in results]
        passes_valid = [passes for correct, passes in results if correct]
        verdict = 0 if not passes_valid else (1 if all(passes_valid) else -1)
        passes = [[passes] for _, passes in results]
        score = sum(cure_test_raw(valid, passes, [trajectory.outcome == 1])) if tests else 0.0
        out.append(judgement(completion, verdict, float(score)))
    return out


def judge_steps(
    env: Environment, trajectory: Trajectory, completions: list[list[Any]]
) -> list[StepJudgement]:
    tested = judged_by_unit_tests(env)
    out = []
    for step, samples in zip(trajectory.steps, completions, strict=True):
        if tested is not None:
            judgements = code_judgements(tested, trajectory, step.response, samples)
        else:
            judgements = [judgement(c, parse_verdict(c.text)) for c in samples]
        out.append(StepJudgement(step_index=step.index, judgements=judgements))
    return out


def oracle_steps(
    env: Environment, trajectory: Trajectory, m: int, *, mode: VerdictSource = "oracle"
) -> list[StepJudgement]:
    """The oracle ablations (`judge.verdicts`): m copies of a verdict from the environment, no tokens.
    "oracle": its own label of each step (+1 progress, -1 not, 0 where the domain has no labels or the
    replay ended); "oracle-explore": a step the environment says explores (`step_explores`) is progress
    too; "oracle-valid": the label for valid answers, 0 for invalid ones (the plan alone);
    "oracle-invalid": -1 for an invalid answer, 0 for every valid one (the format alone)."""
    explores = getattr(env, "step_explores", None) if mode == "oracle-explore" else None
    episode = env.reset(trajectory.task)
    history: list[str] = []
    out = []
    for step in trajectory.steps:
        verdict = 0
        if not episode.done:
            searching = explores is not None and explores(trajectory.task, history, step.response)
            result, label = step_with_label(env, episode, trajectory.task, history, step.response)
            verdict = label_verdict(True if searching else label)
            if mode == "oracle-valid" and not result.valid_action:
                verdict = 0
            elif mode == "oracle-invalid":
                verdict = 0 if result.valid_action else -1
        history.append(step.response)
        oracle = Judgement(verdict=verdict, prompt_token_ids=[], response_token_ids=[], behaviour_logprobs=[],
                           text="oracle")  # fmt: skip
        out.append(StepJudgement(step_index=step.index, judgements=[oracle] * m))
    return out


# --- the role ------------------------------------------------------------------------------------
async def run(config: RunConfig, *, shutdown: anyio.Event | None = None) -> None:
    shutdown = shutdown or anyio.Event()
    cfg, model = config.judge, config.reward_model  # verdicts are sampled at the model's temperature

    async with Bus(config.kafka, role="judge") as bus:
        serving = await load_serving_model(config, bus, "reward") if cfg.verdicts == "model" else None
        judge_id = serving.worker_id if serving is not None else f"oracle-{os.getpid()}"

        def judge(trajectory: Trajectory) -> JudgedTrajectory:
            """Blocking: prompts, one batched generate of m samples per step, verdicts (or the
            environment's labels, for the oracle ablations: no model, reward version 0)."""
            env = shared_environment(trajectory.task.domain)
            if serving is None:
                steps = oracle_steps(env, trajectory, cfg.m, mode=cfg.verdicts)
                return JudgedTrajectory(
                    trajectory=trajectory, steps=steps, reward_version=0, judge_id=judge_id
                )
            backend = serving.backend
            tested = judged_by_unit_tests(env)
            prompts = verdict_prompts(env, trajectory) if tested is None else code_prompts(tested, trajectory)
            version = backend.version
            completions = backend.generate(
                prompts, n=cfg.m, temperature=model.temperature, max_tokens=cfg.max_new_tokens
            )
            return JudgedTrajectory(
                trajectory=trajectory,
                steps=judge_steps(env, trajectory, completions),
                reward_version=version,
                judge_id=judge_id,
            )

        async def handle(record: Record[Trajectory]) -> None:
            trajectory = record.value
            if serving is not None and cfg.follow_weights:
                await serving.refresh()
            try:
                judged = await anyio.to_thread.run_sync(functools.partial(judge, trajectory))
            except SandboxUnavailable as e:  # this machine's fault, not the record's: stop, loudly
                raise FatalError(f"the sandbox for model-written code cannot start: {e}") from e
            await bus.send(topics.JUDGED, judged, key=trajectory.request_id)
            await bus.metric("judge/judged", 1.0, step=judged.reward_version, judge=judge_id)

        async with anyio.create_task_group() as tg:
            if serving is not None:
                tg.start_soon(serving.watcher.run, shutdown)
            await bus.consume(
                [topics.TRAJECTORIES],
                group="judges",
                handler=handle,
                idempotency_key=lambda r: r.value.key,
                shutdown=shutdown,
            )
            tg.cancel_scope.cancel()
