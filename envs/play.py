"""Playing tasks with any generation backend, recording what the reward model would judge.

One home for the loop "prompt every live episode, step it with the backend's answer, record the
step's judge prompt and the environment's own step label (`step_is_progress`, or the episode's
`last_step_progress` where it keeps what that needs; None where the domain has neither)". Held-out
evaluation plays held-out tasks with it; the reward model's bootstrap
plays training tasks with the policy preset, so the reward model learns on the steps it will judge.
The backend is anything with the generation backends' `generate(prompts, temperature=,
max_tokens=, seed=)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envs.base import Environment, StepResult, parse_choice
from envs.judging import judge_prompt


@dataclass
class PlayedStep:
    index: int  # turn within its episode
    judge_prompt: str
    valid: bool
    progress: bool | None  # the environment's label; None where the domain has none
    completion: Any = None  # the backend's answer (tokens, logprobs, version): what a learner trains on
    prompt: str | None = None  # the policy's prompt, where the expert's response was asked for
    expert: str | None = None  # the expert's response from the state before this step (DAgger's label)


@dataclass
class PlayedEpisode:
    level: int
    outcome: int
    steps: list[PlayedStep] = field(default_factory=list)

    @property
    def invalid(self) -> int:
        return sum(not s.valid for s in self.steps)


def label_verdict(label: bool | None) -> int:
    """A step label as a verdict: +1 progress, -1 not, 0 where there is no label."""
    return 0 if label is None else (1 if label else -1)


def step_with_label(
    env: Environment, episode: Any, task: Any, history: list[str], response: str
) -> tuple[StepResult, bool | None]:
    """Step `episode` with `response` and label the step: the episode's own `last_step_progress` where
    it keeps what that needs (TextWorld: no replay), else the env's `step_is_progress` (replays
    `history` from the start), else None."""
    own = getattr(episode, "last_step_progress", None)
    progress = getattr(env, "step_is_progress", None)
    label = progress(task, history, response) if own is None and progress is not None else None
    result = episode.step(response)
    return result, (own() if own is not None else label)


def first_valid(episode: Any, answers: list[Any]) -> Any:
    """The first of `answers` (completions with a `.text`) that names one of the episode's listed
    actions, else the first: what a policy that never answered out of format would have played."""
    index = first_valid_index(episode, answers)
    return answers[0 if index is None else index]


def first_valid_index(episode: Any, answers: list[Any]) -> int | None:
    """Where the first of `answers` that names a listed action stands, None when none does."""
    listed = getattr(episode, "admissible", None)
    if listed is None:
        raise ValueError(
            f"{type(episode).__name__} lists no actions: redrawing invalid answers needs admissible()"
        )
    actions = listed()
    return next((k for k, a in enumerate(answers) if parse_choice(a.text, actions) is not None), None)


ROUND_SEED_STRIDE = 1_000_003  # the second round's seed offset: apart from the next turns' seeds
FIRST_DRAWS = 2  # a redrawn turn's first round of draws per prompt


def draw_until_valid(
    backend: Any,
    episodes: list[Any],
    prompts: list[str],
    *,
    redraw: int,
    temperature: float,
    max_tokens: int,
    seed: int,
) -> list[list[Any]]:
    """Each prompt's draws up to and including its first listed answer, at most `redraw` of them (all
    `redraw` when none is listed): two draws each, then the rest for the prompts whose two named no
    listed action. The draws are independent, so the played answer (the first listed one, else the first)
    is distributed as when all `redraw` are drawn at once; the draws after it, which nobody plays, are
    mostly never decoded. On the tiny household preset at level 8 (8 episodes, redraw 8) a turn took
    0.22-0.29 s against 0.35-0.53 s for 64 draws at once; two calls of one and seven draws, or rounds of
    1, 2, 4, 1, cost more prefill than they saved. With `redraw` 1: one draw each, listed or not."""
    if redraw == 1:
        return backend.generate(prompts, n=1, temperature=temperature, max_tokens=max_tokens, seed=seed)
    groups: list[list[Any]] = [[] for _ in prompts]
    open_ = list(range(len(prompts)))
    round_ = 0
    while open_:
        take = min(FIRST_DRAWS, redraw) if round_ == 0 else redraw - len(groups[open_[0]])
        outs = backend.generate(
            [prompts[i] for i in open_],
            n=take,
            temperature=temperature,
            max_tokens=max_tokens,
            seed=(seed + round_ * ROUND_SEED_STRIDE) % 2**31,
        )
        still = []
        for i, drawn in zip(open_, outs, strict=True):
            found = first_valid_index(episodes[i], drawn)
            groups[i] += drawn if found is None else drawn[: found + 1]
            if found is None and len(groups[i]) < redraw:
                still.append(i)
        open_, round_ = still, round_ + 1
    return groups


def play_tasks(
    backend: Any,
    env: Environment,
    tasks: list[Any],
    *,
    temperature: float,
    max_tokens: int,
    max_steps: int,
    seed: int,
    expert: bool = False,
    redraw: int = 1,
) -> list[PlayedEpisode]:
    """Play `tasks` side by side (one generate call per turn); generation seed `seed + turn`. With
    `expert`, each step also records its prompt and the env's `expert_response` from that state. With
    `redraw` > 1 each turn plays the first valid of up to that many answers (`draw_until_valid`): the
    policy conditioned on answering in format, its own preferences among the listed actions kept."""
    ask = getattr(env, "expert_response", None) if expert else None
    prefetch = getattr(env, "prefetch", None)  # a domain whose tasks are costly to build (TextWorld)
    if prefetch is not None:
        prefetch(tasks)
    episodes = [env.reset(t) for t in tasks]
    records = [PlayedEpisode(level=t.difficulty, outcome=-1) for t in tasks]
    history: list[list[str]] = [[] for _ in tasks]
    for turn in range(max_steps):
        live = [i for i, e in enumerate(episodes) if not e.done]
        if not live:
            break
        prompts = [episodes[i].prompt() for i in live]
        outs = draw_until_valid(
            backend, [episodes[i] for i in live], prompts,
            redraw=redraw, temperature=temperature, max_tokens=max_tokens, seed=seed + turn,
        )  # fmt: skip
        for i, prompt, group in zip(live, prompts, outs, strict=True):
            episode = episodes[i]
            answer = first_valid(episode, group) if redraw > 1 else group[0]
            response = answer.text
            context = episode.judge_context(len(history[i]))
            best = ask(episode) if ask is not None else None
            result, label = step_with_label(env, episode, tasks[i], history[i], response)
            history[i].append(response)
            records[i].steps.append(
                PlayedStep(
                    len(history[i]) - 1,
                    judge_prompt(context, response, result.observation),
                    result.valid_action,
                    label,
                    answer,
                    prompt if ask is not None else None,
                    best,
                )
            )
    for record, episode in zip(records, episodes, strict=True):
        record.outcome = 1 if episode.done and episode.outcome == 1 else -1
    return records
