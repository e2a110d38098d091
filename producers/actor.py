"""Actor: runs the episodes a rollout request asks for with the current policy.

Consumes: `forge.rollout.requests` (group "actors"; a second actor process joining the group takes
          over partitions), `forge.weights` through a WeightsWatcher (policy versions).
Produces: `forge.trajectories` (one Trajectory per rollout, key request_id/rollout_index: a group's
          rollouts spread over the judges), metrics
          `actor/trajectories`, `actor/success`, `actor/episodes_per_s`.
Invariant: a request's offset is committed only after all n of its trajectories were acked by the
broker (offsets advance past a record only when every earlier record of its partition is done too),
so a killed actor loses nothing; a request_id seen before is skipped. Every Step carries the
policy version that generated it and the behaviour logprobs of its sampled tokens (sampling
distribution, see infra.models), so weights may change between any two turns.

Several requests' episodes run at once, up to `actor.parallel_episodes`; each turn generates the
next answer of every live episode in one batched call (with `actor.redraw`, more calls for the episodes
whose draws so far named no listed action: `envs.play.draw_until_valid`).
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import anyio

from envs import shared_environment
from envs.base import Episode, boxed, listed_prefix
from envs.play import draw_until_valid, first_valid_index
from infra.bus import BatchConsumer, Bus, RecentKeys, Record
from infra.models.tokenizer import encode_response
from infra.models.types import tokens_within
from pipeline.serving import load_serving_model
from schemas import topics
from schemas.config import RunConfig
from schemas.events import RejectedAnswer, RolloutRequest, Step, Trajectory, wire_logprobs

log = logging.getLogger("forgestream.actor")

TopicPartition = tuple[str, int]


# --- bookkeeping ---------------------------------------------------------------------------------
class OffsetTracker:
    """Per partition, the offsets of fetched records and whether they are done; a commit never
    passes an unfinished record and never moves backwards (a rebalance can redeliver old offsets)."""

    def __init__(self) -> None:
        self._open: dict[TopicPartition, dict[int, bool]] = {}
        self._committed: dict[TopicPartition, int] = {}

    def start(self, record: Record[Any]) -> None:
        tp = (record.topic, record.partition)
        self._open.setdefault(tp, {})[record.offset] = False
        self._committed.setdefault(tp, record.offset)  # the group's position when we got the partition

    def finish(self, record: Record[Any]) -> None:
        self._open[(record.topic, record.partition)][record.offset] = True

    def forget(self, record: Record[Any]) -> None:
        """A record of a partition we lost: the new owner redelivers it."""
        self._open.get((record.topic, record.partition), {}).pop(record.offset, None)

    def committable(self) -> dict[TopicPartition, int]:
        """(topic, partition) -> next offset to commit, for partitions whose done prefix grew."""
        out: dict[TopicPartition, int] = {}
        for tp, offsets in self._open.items():
            if not offsets:
                continue
            unfinished = [o for o, done in offsets.items() if not done]
            next_offset = min(unfinished) if unfinished else max(offsets) + 1
            for o in [o for o in offsets if o < next_offset]:
                del offsets[o]
            if next_offset > self._committed.get(tp, 0):
                self._committed[tp] = out[tp] = next_offset
        return out


@dataclass
class RequestRun:
    record: Record[RolloutRequest]
    request: RolloutRequest
    remaining: int
    admitted_at: float = field(default_factory=time.monotonic)
    successes: int = 0


@dataclass
class LiveEpisode:
    run: RequestRun
    rollout_index: int
    episode: Episode
    max_steps: int
    steps: list[Step] = field(default_factory=list)


def spelled_tokens(tokenizer: Any, completion: Any, chars: int) -> int:
    """How many of an answer's tokens lie within its first `chars` characters (its listed prefix)."""
    return tokens_within(tokenizer, list(completion.token_ids), chars) if chars else 0


def rejected_answer(tokenizer: Any, completion: Any, actions: list[str]) -> RejectedAnswer:
    """An invalid draw that was not played, with the tokens that still spelled a listed action."""
    return RejectedAnswer(
        response_token_ids=list(completion.token_ids),
        behaviour_logprobs=wire_logprobs(completion.logprobs),
        listed_prefix_tokens=spelled_tokens(tokenizer, completion, listed_prefix(completion.text, actions)),
    )


def play_turn(
    live: list[LiveEpisode],
    prompts: list[str],
    completions: list[list[Any]],
    tokenizer: Any = None,
    listed_answers: bool = False,
) -> list[LiveEpisode]:
    """Apply one generated answer to each live episode (of several, the first valid one); returns the
    episodes that just ended. With the `tokenizer`, an invalid answer records how many of its tokens
    still spelled a listed action, and so does each invalid draw passed over (`Step.rejected`); with
    `listed_answers` too, each step records every listed action's answer as tokens (the listed-token
    loss, the listed-conditional term), as the state listed them before the step."""
    ended = []
    for ep, prompt, group in zip(live, prompts, completions, strict=True):
        found = first_valid_index(ep.episode, group) if len(group) > 1 else 0
        # the draws before the played one were invalid; when none was valid (the first is played), all
        # the others are. Draws after a valid one were not passed over (`draw_until_valid` never makes
        # them; a group given whole may have them)
        completion = group[found or 0]
        passed = group[1:] if found is None else group[:found]
        # the actions as listed before the step, asked once and only where used (only domains that list
        # actions have them)
        wanted = tokenizer is not None and (listed_answers or passed)
        actions = ep.episode.admissible() if wanted else []
        listed = [encode_response(tokenizer, boxed(a)) for a in actions] if listed_answers else []
        rejected = [rejected_answer(tokenizer, c, actions) for c in passed] if wanted else []
        result = ep.episode.step(completion.text)
        chars = result.info.get("listed_prefix", 0) if tokenizer is not None else 0
        prefix = spelled_tokens(tokenizer, completion, int(chars))
        ep.steps.append(
            Step(
                index=len(ep.steps),
                prompt=prompt,
                response=completion.text,
                prompt_token_ids=list(completion.prompt_token_ids),
                response_token_ids=list(completion.token_ids),
                behaviour_logprobs=wire_logprobs(completion.logprobs),
                policy_version=completion.version,  # the weights that sampled these tokens
                observation=result.observation,
                valid_action=result.valid_action,
                listed_prefix_tokens=prefix,
                rejected=rejected,
                listed_answers=listed,
            )
        )
        if ep.episode.done or len(ep.steps) >= ep.max_steps:
            ended.append(ep)
    return ended


# --- the role ------------------------------------------------------------------------------------
async def run(config: RunConfig, *, shutdown: anyio.Event | None = None) -> None:
    shutdown = shutdown or anyio.Event()
    cfg, model = config.actor, config.policy_model
    offsets = OffsetTracker()
    finished_ids = RecentKeys(max(1, config.kafka.dedup_window))  # finished request ids
    running: dict[str, RequestRun] = {}
    waiting: collections.deque[tuple[RequestRun, int]] = collections.deque()
    live: list[LiveEpisode] = []
    ended_at: collections.deque[float] = collections.deque(maxlen=64)
    turn = 0
    # steps carry their listed answers (the listed-token loss, the listed-conditional term)
    listed = config.listed_answers.recorded
    # rollouts per request, as the requests say (the first fetch takes one): sizes each fetch
    expected_n = cfg.parallel_episodes

    async with Bus(config.kafka, role="actor") as bus:
        serving = await load_serving_model(config, bus, "policy")
        backend, watcher, actor_id = serving.backend, serving.watcher, serving.worker_id

        async def admit(consumer: Any) -> None:
            """Fetch requests while fewer episodes than parallel_episodes are live or waiting."""
            nonlocal expected_n
            free = cfg.parallel_episodes - len(live) - len(waiting)
            if free <= 0:
                return
            records = await consumer.next_batch(
                max(1, -(-free // expected_n)), timeout_s=0.02 if live else 0.5
            )
            for record in records:
                request: RolloutRequest = record.value
                expected_n = request.n
                if request.request_id in running:
                    continue  # redelivered while still running: that run commits it
                offsets.start(record)
                if request.request_id in finished_ids:
                    offsets.finish(record)  # redelivered: its trajectories were produced already
                    continue
                request_run = RequestRun(record, request, remaining=request.n)
                running[request.request_id] = request_run
                waiting.extend((request_run, i) for i in range(request.n))

        seen_assignment: set[tuple[str, int]] = set()

        def drop_revoked(consumer: Any) -> None:
            """Stop work on requests whose partition moved to another actor (it redelivers them)."""
            assigned = consumer.assignment()
            if assigned != seen_assignment:
                seen_assignment.clear()
                seen_assignment.update(assigned)
                log.info("actor: assigned partitions %s", sorted(p for _, p in assigned))
            lost = [r for r in running.values() if (r.record.topic, r.record.partition) not in assigned]
            for request_run in lost:
                del running[request_run.request.request_id]
                offsets.forget(request_run.record)
            if lost:
                gone = {id(r) for r in lost}
                live[:] = [ep for ep in live if id(ep.run) not in gone]
                kept = [(r, i) for r, i in waiting if id(r) not in gone]
                waiting.clear()
                waiting.extend(kept)
                log.info("actor: %d requests moved to another actor", len(lost))

        def ready(request_run: RequestRun) -> bool:
            """A request runs once the policy is at least its min_policy_version (or it waited enough)."""
            if request_run.request.min_policy_version <= backend.version:
                return True
            return time.monotonic() - request_run.admitted_at > cfg.min_version_wait_s

        def start_episodes() -> None:
            blocked: list[tuple[RequestRun, int]] = []
            while waiting and len(live) < cfg.parallel_episodes:
                request_run, index = waiting.popleft()
                if not ready(request_run):
                    blocked.append((request_run, index))
                    continue
                task = request_run.request.task
                episode = shared_environment(task.domain).reset(task)
                live.append(LiveEpisode(request_run, index, episode, min(cfg.max_steps, episode.max_steps)))
            waiting.extendleft(reversed(blocked))

        async def publish(ended: list[LiveEpisode]) -> None:
            for ep in ended:
                live.remove(ep)
                request = ep.run.request
                trajectory = Trajectory(
                    request_id=request.request_id,
                    rollout_index=ep.rollout_index,
                    group_size=request.n,
                    task=request.task,
                    steps=ep.steps,
                    outcome=ep.episode.outcome,
                    actor_id=actor_id,
                )
                await bus.send(topics.TRAJECTORIES, trajectory, key=trajectory.key)
                ended_at.append(time.monotonic())
                ep.run.remaining -= 1
                ep.run.successes += int(trajectory.outcome == 1)
                await bus.metric("actor/trajectories", 1.0, step=backend.version, actor=actor_id)
                await bus.metric("actor/success", float(trajectory.outcome == 1), step=backend.version)
                if ep.run.remaining == 0:
                    offsets.finish(ep.run.record)
                    finished_ids.add(request.request_id)
                    del running[request.request_id]
            if ended and len(ended_at) >= 2 and ended_at[-1] > ended_at[0]:
                rate = (len(ended_at) - 1) / (ended_at[-1] - ended_at[0])
                await bus.metric("actor/episodes_per_s", rate, step=backend.version, actor=actor_id)

        async def rollout_loop() -> None:
            nonlocal turn
            async with BatchConsumer(bus, [topics.ROLLOUT_REQUESTS], group="actors") as consumer:
                while not shutdown.is_set():
                    # --- admit new requests, refresh weights, start episodes ---
                    await admit(consumer)
                    drop_revoked(consumer)
                    if cfg.swap_weights == "every_turn" or not live:
                        await serving.refresh()
                        start_episodes()
                    elif watcher.newer_than(backend.version) is None:
                        start_episodes()  # else the running episodes finish on their version first
                    if not live:
                        if waiting:  # blocked on a policy version not loaded yet
                            with anyio.move_on_after(0.5):
                                await watcher.wait_newer_than(backend.version)
                        continue
                    # --- one turn: every live episode's next answer, batched across episodes ---
                    prompts = [ep.episode.prompt() for ep in live]
                    seed = (model.seed * 1_000_003 + os.getpid() * 7919 + turn) % 2**31
                    completions = await anyio.to_thread.run_sync(
                        functools.partial(
                            draw_until_valid,
                            backend,
                            [ep.episode for ep in live],
                            prompts,
                            redraw=cfg.redraw,
                            temperature=model.temperature,
                            max_tokens=model.max_new_tokens,
                            seed=seed,
                        )
                    )
                    turn += 1
                    ended = await anyio.to_thread.run_sync(
                        play_turn, list(live), prompts, completions, backend.tokenizer, listed
                    )
                    # --- publish finished rollouts, then commit what is wholly done ---
                    await publish(ended)
                    done = offsets.committable()
                    if done:
                        await consumer.commit(done)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watcher.run, shutdown)
            await rollout_loop()
            tg.cancel_scope.cancel()
