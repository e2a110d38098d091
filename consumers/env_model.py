"""Environment model: turns harder/easier task events into pending task variants.

Consumes: `forge.task.events` (group "env-model"; kinds harder / easier, others ignored),
          `forge.tasks` (the task pool: last value per task_id, read at start then followed).
Produces: `forge.tasks` (a TaskSpec with status "pending", parent_id, direction and
          parent_accuracy = the event's accuracy, key task_id), metrics `env_model/*`.
Invariant: only an active task without a pending child gets a variant; a variant never has the
signature of an active or pending task; where the domain has an oracle, the variant is solvable
(its oracle's answers, replayed in a fresh episode, succeed). Events are deduplicated by
event_id, and a redelivered event proposes the same variant (the rng is seeded by the event id),
which the pending-child rule then refuses.

kind = "rule" (default): the first acceptable candidate from `env.propose_variant`.
kind = "llm": up to `env_model.llm_candidates` acceptable rule-based candidates are listed, with the
critic feedback, in a prompt to the policy-preset model, which answers `\\boxed{index}`; an
unparseable or out-of-range answer falls back to the first candidate. The model only chooses;
the rules still guarantee validity, novelty and solvability.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import anyio
import msgspec

from envs import parse_boxed, shared_environment
from envs.base import Environment
from infra.bus import Bus, Record
from pipeline.taskpool import TaskPool, follow_tasks, restore_tasks
from schemas import topics
from schemas.config import RunConfig
from schemas.events import CriticFeedback, TaskEvent, TaskSpec

log = logging.getLogger("forgestream.env_model")


# --- proposing -----------------------------------------------------------------------------------
def solvable(env: Environment, task: TaskSpec) -> bool:
    """Replays the oracle's answers in a fresh episode; True when they reach the goal."""
    try:
        answers = env.oracle(task)
    except NotImplementedError:
        return True  # no oracle for this domain: nothing to check
    except ValueError:
        return False  # the oracle found no solution
    episode = env.reset(task)
    for answer in answers:
        if episode.done:
            break
        episode.step(answer)
    return episode.done and episode.outcome == 1


def candidates(
    env: Environment,
    parent: TaskSpec,
    event: TaskEvent,
    taken: set[str],
    rng: random.Random,
    *,
    attempts: int,
    want: int,
) -> tuple[list[TaskSpec], dict[str, int]]:
    """Up to `want` acceptable pending variants of `parent` within `attempts` proposals, and the
    reasons the others were refused."""
    direction = event.kind
    assert direction in ("harder", "easier")
    found: list[TaskSpec] = []
    refused = {"none": 0, "duplicate": 0, "unsolvable": 0}
    for _ in range(attempts):
        if len(found) >= want:
            break
        proposal = env.propose_variant(parent, direction, event.critic, rng)
        if proposal is None:
            refused["none"] += 1
            continue
        signature = env.signature(proposal)
        if signature in taken or signature == parent.signature:
            refused["duplicate"] += 1
            continue
        if not solvable(env, proposal):
            refused["unsolvable"] += 1
            continue
        taken.add(signature)
        task_id = proposal.task_id
        if task_id == parent.task_id or not task_id:
            task_id = f"{parent.task_id}.{direction[0]}{signature[:8]}"
        found.append(
            msgspec.structs.replace(
                proposal,
                task_id=task_id,
                signature=signature,
                status="pending",
                version=0,
                parent_id=parent.task_id,
                direction=direction,
                parent_accuracy=event.accuracy,
                generation=parent.generation + 1,
            )
        )
    return found, refused


def llm_prompt(parent: TaskSpec, direction: str, critic: CriticFeedback, options: list[TaskSpec]) -> str:
    """The env model's prompt: the parent, the critic feedback and numbered candidate variants."""
    lines = [
        f"You design training tasks for an agent. The agent's accuracy on this task calls for a "
        f"{direction} variant.",
        f"Task (difficulty {parent.difficulty}): {parent.params}",
    ]
    if critic.failed_actions:
        lines.append(
            "Steps the reward model judged wrong in failed attempts: " + "; ".join(critic.failed_actions[:5])
        )
    if critic.success_patterns:
        lines.append("Answers from successful attempts: " + "; ".join(critic.success_patterns[:3]))
    lines.append("Candidate variants:")
    lines += [f"{i}: difficulty {t.difficulty}, {t.params}" for i, t in enumerate(options)]
    lines.append(
        f"Pick the candidate that best targets what the agent gets wrong while being {direction}. "
        "Answer with \\boxed{index}."
    )
    return "\n".join(lines)


def choose(text: str, count: int) -> int:
    """Index parsed from the model's `\\boxed{i}`; 0 when unparseable or out of range."""
    boxed = parse_boxed(text)
    if boxed is not None and boxed.strip().isdigit() and int(boxed) < count:
        return int(boxed)
    return 0


# --- the role ------------------------------------------------------------------------------------
async def run(config: RunConfig, *, shutdown: anyio.Event | None = None) -> None:
    shutdown = shutdown or anyio.Event()
    cfg = config.env_model
    pool = TaskPool()
    backend: Any = None
    if cfg.kind == "llm":
        from infra.models import load_backend

        workdir = Path(config.workdir)
        backend = await anyio.to_thread.run_sync(
            lambda: load_backend(config.policy_model, role="policy", workdir=workdir)
        )

    async with Bus(config.kafka, role="env-model") as bus:
        await restore_tasks(bus, pool)

        async def handle(record: Record[TaskEvent]) -> None:
            event = record.value
            if event.kind not in ("harder", "easier"):
                return
            parent = pool.eligible(event.task_id)
            if parent is None:
                await bus.metric("env_model/ineligible", 1.0, kind=event.kind)
                return
            # --- propose (oracle checks can run model-written code: off the event loop) ---
            env = shared_environment(parent.domain)  # a variant is of its parent's domain
            rng = random.Random(f"{config.seed}:{event.event_id}")
            want = cfg.llm_candidates if backend is not None else 1
            found, refused = await anyio.to_thread.run_sync(
                lambda: candidates(
                    env, parent, event, pool.live_signatures(), rng, attempts=cfg.max_attempts, want=want
                )
            )
            if not found:
                log.info("env-model: no %s variant of %s (%s)", event.kind, parent.task_id, refused)
                await bus.metric("env_model/failed", 1.0, kind=event.kind)
                return
            pick = 0
            if backend is not None and len(found) > 1:
                prompt = llm_prompt(parent, event.kind, event.critic, found)
                out = await anyio.to_thread.run_sync(
                    lambda: backend.generate(
                        [prompt],
                        n=1,
                        temperature=config.policy_model.temperature,
                        max_tokens=config.policy_model.max_new_tokens,
                    )
                )
                pick = choose(out[0][0].text, len(found))
                await bus.metric("env_model/llm_choice", float(pick), kind=event.kind)
            variant = found[pick]
            # --- publish (and remember at once, so the next event sees the pending child) ---
            await bus.send(topics.TASKS, variant, key=variant.task_id)
            pool.update(variant)
            await bus.metric("env_model/proposed", 1.0, kind=event.kind)
            log.info("env-model: %s variant %s of %s", event.kind, variant.task_id, parent.task_id)

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow_tasks, bus, pool, shutdown)
            await bus.consume(
                [topics.TASK_EVENTS],
                group="env-model",
                handler=handle,
                idempotency_key=lambda r: r.value.event_id,
                shutdown=shutdown,
            )
            tg.cancel_scope.cancel()
