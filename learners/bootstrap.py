"""Bootstrap data and SFT for the tiny presets, drawn from the environments themselves.

- `corpus_texts`: prompts, oracle responses and verdict-labelled judge prompts of the bootstrap
  domains (the tokenizer's training text).
- `policy_pairs`: (episode prompt, oracle response) along oracle trajectories.
- `reward_pairs`: (judge prompt, `\\boxed{1}` / `\\boxed{-1}`) from two sources:
  branching steps (replay the oracle for k steps, then take either the oracle's next response or
  another plausible one; the label is `env.step_is_progress(task, history, response)` when the env
  has it, else "equals the oracle's next response"; labels balanced), and, given `rollouts`, the
  steps a policy played on training tasks (`rollout_examples`), labelled by the environment, drawn in
  the share they were played, ROLLOUT_SHARE of all.
- `visited_state_pairs`: (prompt, expert response) in the states a policy reached on training tasks
  (DAgger's data; `mixed_pairs` mixes them with demonstrations).
- `sft`: loss on answer tokens only, batch 32, AdamW lr 2e-3 decaying linearly to 10 %, seeded.
- `verdict_accuracy`: a reward model's verdicts against the labels of fresh bootstrap examples
  (held-out policy success and process accuracy live in pipeline/evaluation.py).
Every stream is a pure function of its seed.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import time
from collections.abc import Iterable, Iterator
from typing import Any

from envs.base import boxed, parse_choice
from envs.seeds import training_rng

log = logging.getLogger(__name__)

CORPUS_VERSION = 1
MAX_SFT_TOKENS = 1024  # longer examples are skipped: they would dominate a CPU step
GOOD, BAD = "\\boxed{1}", "\\boxed{-1}"


def available_environments(
    domains: Iterable[str] | None = None, *, expert: str = "omniscient"
) -> dict[str, Any]:
    """domain -> Environment for each domain whose module is importable (envs land independently);
    `expert` other than omniscient goes to the environments whose expert has that mode."""
    import envs

    out: dict[str, Any] = {}
    for domain in domains if domains is not None else envs.DOMAINS:
        try:
            out[domain] = envs.get_environment(domain)
        except ImportError as e:
            log.warning("domain %s unavailable for bootstrap: %s", domain, e)
            continue
        if expert != "omniscient" and hasattr(out[domain], "expert"):
            out[domain].expert = expert
    return out


def _training_task(
    env: Any, level: int, rng: random.Random, *, unseen: bool = False, dagger_round: int | None = None
) -> Any:
    """A training task of `level`. An env whose tasks are costly to build (TextWorld: a game is seconds
    of the engine's generator) names `bootstrap_games`: its bootstrap draws from the games of that many
    seeds per level (DAgger round `dagger_round`: of `dagger_pool`'s), and with `unseen` from as many
    seeds past every pool the policy preset trains on."""
    games = getattr(env, "bootstrap_games", 0)
    if not games:
        return env.sample_task(level, training_rng(rng))
    first = max(games, *getattr(env, "dagger_games", ())) if unseen else 0
    drawn = games if unseen else _pool_games(env, dagger_round)
    return env.sample_task(level, random.Random(first + rng.randrange(drawn)))


def _pool_games(env: Any, dagger_round: int | None) -> int:
    """Games per level in the pool training tasks come from (DAgger round `dagger_round`'s, else the
    demonstrations'); 0 where every task is new."""
    return dagger_pool(env, dagger_round) if dagger_round is not None else getattr(env, "bootstrap_games", 0)


def prefetch_pools(domains: list[str], dagger_round: int | None = None) -> None:
    """Build every game the demonstrations of `domains` may draw (DAgger round `dagger_round`'s pool) at
    once, one per core, where a domain's tasks are costly to build and come from a pool (TextWorld);
    drawn lazily, they were built one at a time. A preset build calls this before its SFT or round."""
    for env in available_environments(domains).values():
        games = _pool_games(env, dagger_round)
        if games and getattr(env, "prefetch", None) is not None:
            env.prefetch([env.sample_task(level, random.Random(i))
                          for level in _bootstrap_levels(env) for i in range(games)])  # fmt: skip


def dagger_pool(env: Any, dagger_round: int) -> int:
    """Games per level DAgger round `dagger_round` draws from: the env's `dagger_games` entry for it
    (the last one past its end), else the demonstrations' pool (0: no pool)."""
    widths = getattr(env, "dagger_games", ())
    return widths[min(dagger_round, len(widths) - 1)] if widths else getattr(env, "bootstrap_games", 0)


def dagger_pools(domains: list[str]) -> dict[str, tuple[int, ...]]:
    """domain -> `dagger_games` of the domains whose DAgger rounds widen their pool (part of the policy
    preset's key there; household has none and keeps its key)."""
    envs_by_domain = available_environments(domains)
    return {d: tuple(e.dagger_games) for d, e in envs_by_domain.items() if getattr(e, "dagger_games", ())}


def dagger_rounds(domains: list[str]) -> int:
    """The policy preset's DAgger rounds where the config leaves it to the domains: one per entry of
    the longest `dagger_games`, else one."""
    return max((len(games) for games in dagger_pools(domains).values()), default=1)


def rollout_pool(domains: list[str]) -> str | None:
    """Where the reward preset's rollouts are played: "unseen" where a domain's bootstrap draws from a
    pool of games (part of the reward preset's key there), None where every task is new anyway."""
    pooled = any(getattr(e, "bootstrap_games", 0) for e in available_environments(domains).values())
    return "unseen" if pooled else None


def _bootstrap_levels(env: Any) -> list[int]:
    """The levels bootstrap data come from: all, or the env's `bootstrap_levels`."""
    return list(getattr(env, "bootstrap_levels", range(env.levels)))


def _task(env: Any, rng: random.Random, dagger_round: int | None = None) -> Any:
    return _training_task(env, rng.choice(_bootstrap_levels(env)), rng, dagger_round=dagger_round)


def _oracle_walk(env: Any, task: Any) -> Iterator[tuple[Any, int, str]]:
    """(episode before the step, step index, oracle response) for each oracle step."""
    episode = env.reset(task)
    for i, response in enumerate(env.oracle(task)):
        if episode.done:
            return
        yield episode, i, response
        episode.step(response)


# Demonstrations with detours: per episode a detour rate in [0, DETOUR_MAX]; at each turn a random
# admissible action with that probability, an invalid answer with INVALID_P; every state reached is
# labelled with the expert's response from it, so the policy learns to recover (and what the prompt
# looks like after an invalid answer) instead of only the oracle's own path.
DETOUR_MAX = 0.3
PAIRS_PER_EPISODE = 4
INVALID_P = 0.05
INVALID_ANSWERS = ("\\boxed{99}", "\\boxed{", "boxed{1}", "I will look around.", "\\boxed{-1}", "")


def _detour(episode: Any, rng: random.Random) -> str:
    """A random admissible action, answered as the experts answer (by name)."""
    return boxed(rng.choice(episode.admissible()))


def _mistake(episode: Any, rng: random.Random) -> str:
    """A reward-model negative candidate: an invalid answer 1 time in 4, else a detour."""
    return rng.choice(INVALID_ANSWERS) if rng.random() < 0.25 else _detour(episode, rng)


def _walk(env: Any, task: Any, rng: random.Random) -> Iterator[tuple[Any, list[str], str]]:
    """(episode before the step, responses so far, expert response) at each state of an episode.

    Domains with `expert_response(episode)` get a noisy walk (detours and invalid answers, labelled
    from the state reached); the others the oracle's own path. The episode is live: read it before
    advancing the iterator."""
    expert = getattr(env, "expert_response", None)
    if expert is None:
        oracle = list(env.oracle(task))
        for episode, i, response in _oracle_walk(env, task):
            yield episode, oracle[:i], response
        return
    episode, history = env.reset(task), []
    detour = rng.uniform(0.0, DETOUR_MAX)
    while not episode.done:
        best = expert(episode)
        if best is None:
            return
        yield episode, list(history), best
        u = rng.random()
        response = (
            rng.choice(INVALID_ANSWERS)
            if u < INVALID_P
            else _detour(episode, rng)
            if u < INVALID_P + detour
            else best
        )
        episode.step(response)
        history.append(response)


def policy_pairs(
    domains: list[str], *, seed: int, expert: str = "omniscient", dagger_round: int | None = None
) -> Iterator[tuple[str, str]]:
    """Endless (prompt, expert response) pairs, tasks drawn uniformly over domains and difficulties
    (for DAgger round `dagger_round`: from its pool, where a domain's rounds widen it)."""
    envs_by_domain = available_environments(domains, expert=expert)
    if not envs_by_domain:
        raise RuntimeError(f"no bootstrap domain available among {domains}")
    rng = random.Random(seed)
    names = sorted(envs_by_domain)
    while True:
        env = envs_by_domain[rng.choice(names)]
        task = _task(env, rng, dagger_round)
        pairs = [(episode.prompt(), response) for episode, _, response in _walk(env, task, rng)]
        # a few states per episode: every level weighs about the same, not in proportion to its length
        yield from rng.sample(pairs, min(len(pairs), PAIRS_PER_EPISODE))


def _judge_example(
    env: Any, task: Any, history: list[str], response: str, best: str
) -> tuple[str, int] | None:
    """The judge prompt for taking `response` after `history` in `task`, with its label: the env's
    `step_is_progress` where it has one, else "equals the expert's response" `best`."""
    from envs.judging import judge_prompt
    from envs.play import step_with_label

    episode = env.reset(task)
    for r in history:
        episode.step(r)
    if episode.done:
        return None
    context = episode.judge_context(len(history))
    result, label = step_with_label(env, episode, task, history, response)
    if label is None:  # a domain without step labels: the expert's response is the good one
        label = response.strip() == best.strip()
    return judge_prompt(context, response, result.observation), (1 if label else -1)


# The reward model judges the policy's steps, and those err differently from a random detour:
# measured on held-out household steps of the policy preset, its "take" was progress 23 % of the
# time and its "put" 81 %, and a reward model trained on expert-vs-detour pairs alone agreed with
# the labels no better than chance (balanced 0.54; with 3/4 of its data from the policy's own
# rollouts, 0.73).
ROLLOUT_SHARE = 0.75
# The rollouts' steps are drawn as played (about 3 bad to 1 good on the band), not half and half: a
# judge trained on balanced labels says "good" for its prior's sake on the valid steps it cannot
# tell apart, and the policy's steps are mostly bad (the preset built with balanced draws said good
# to 0.48 of held-out level-8 steps labelled good 0.29). Part of the reward preset's key.
ROLLOUT_DRAW = "as played"
ROLLOUT_PARALLEL = 16


def _play_training(
    backend: Any,
    domains: list[str],
    *,
    needs: str,
    episodes: int,
    levels: Iterable[int],
    seed: int,
    temperature: float,
    max_tokens: int,
    max_steps: int = 40,
    expert: bool = False,
    expert_mode: str = "omniscient",
    unseen: bool = False,
    dagger_round: int | None = None,
) -> Iterator[Any]:
    """The episodes (`envs.play.PlayedEpisode`) `backend` plays on `episodes` training tasks of the
    `domains` whose environment has the attribute `needs`, drawn uniformly from `levels` (those the
    domain has; from the games the policy preset never saw with `unseen`); none where no domain has it."""
    from envs.play import play_tasks

    envs_by_domain = {
        d: e for d, e in available_environments(domains, expert=expert_mode).items() if hasattr(e, needs)
    }
    if not envs_by_domain:
        return
    rng = random.Random(seed)
    names = sorted(envs_by_domain)
    for start in range(0, episodes, ROLLOUT_PARALLEL):
        env = envs_by_domain[rng.choice(names)]
        allowed = _bootstrap_levels(env)
        band = [level for level in levels if level in allowed] or [allowed[-1]]
        count = min(ROLLOUT_PARALLEL, episodes - start)
        tasks = [_training_task(env, rng.choice(band), rng, unseen=unseen, dagger_round=dagger_round)
                 for _ in range(count)]  # fmt: skip
        yield from play_tasks(backend, env, tasks, temperature=temperature, max_tokens=max_tokens,
                              max_steps=max_steps, seed=seed + start * max_steps, expert=expert)  # fmt: skip


def rollout_examples(
    backend: Any,
    domains: list[str],
    *,
    episodes: int,
    levels: Iterable[int],
    seed: int,
    temperature: float,
    max_tokens: int,
    max_steps: int = 40,
) -> tuple[list[str], list[str]]:
    """(good, bad) judge prompts of the steps `backend` plays on `episodes` training tasks (drawn
    uniformly from `levels`, those the domain has), labelled by the environment's
    `step_is_progress`; domains without one give none. Where the bootstrap draws from a pool of games,
    the tasks are games the policy preset never trained on: on its own 80 TextWorld games the policy
    preset played the walkthrough (2,287 steps labelled good, 3 bad) and the reward model learned to say
    "good", where on new games most of its turns are invalid."""
    good: list[str] = []
    bad: list[str] = []
    played = _play_training(backend, domains, needs="step_is_progress", episodes=episodes, levels=levels,
                            seed=seed, temperature=temperature, max_tokens=max_tokens,
                            max_steps=max_steps, unseen=True)  # fmt: skip
    for step in (s for e in played for s in e.steps):
        (good if step.progress else bad).append(step.judge_prompt)
    log.info("reward bootstrap: %d good and %d bad steps from %d rollouts", len(good), len(bad), episodes)
    return good, bad


# DAgger for the policy preset. Demonstrations show the expert's states, and the expert knows the whole
# house: a policy trained on them alone names rooms that are not exits and takes from closed drawers
# once off that path (held-out level 6: 83 % of turns invalid), then repeats. A round plays training
# tasks with the policy and trains on the expert's response in every state the policy reached, mixed
# half and half with fresh demonstrations. Household, 200 held-out tasks, level 6 / 8 (invalid turns at 6):
# the 1,200-step preset 0.45 / 0.21 (0.83); plus one round (256 episodes, 400 steps) 0.77 / 0.49 (0.42).
DAGGER_EPISODES_PER_STEP = 0.64  # episodes played per SFT step of the round (256 for 400 steps)
DAGGER_STEP_SHARE = 1 / 3  # a round's SFT steps per step of the first SFT
DAGGER_OWN_SHARE = 0.5  # share of a round's examples from the policy's own states
DAGGER_LR = 1e-3


def visited_state_pairs(
    backend: Any,
    domains: list[str],
    *,
    episodes: int,
    levels: Iterable[int],
    seed: int,
    temperature: float,
    max_tokens: int,
    max_steps: int = 40,
    expert: str = "omniscient",
    dagger_round: int | None = None,
) -> list[tuple[str, str]]:
    """(prompt, expert response) in every state `backend` reached on `episodes` training tasks (of DAgger
    round `dagger_round`'s pool, where a domain's rounds widen it), for the domains that have
    `expert_response` (in the `expert` mode where the domain has modes); the others give none."""
    played = _play_training(backend, domains, needs="expert_response", episodes=episodes, levels=levels,
                            seed=seed, temperature=temperature, max_tokens=max_tokens, max_steps=max_steps,
                            expert=True, expert_mode=expert, dagger_round=dagger_round)  # fmt: skip
    pairs = [(s.prompt, s.expert) for e in played for s in e.steps if s.prompt is not None and s.expert]
    log.info("dagger: %d labelled states from %d episodes", len(pairs), episodes)
    return pairs


def mixed_pairs(
    own: list[tuple[str, str]], demonstrations: Iterator[tuple[str, str]], *, own_share: float, seed: int
) -> Iterator[tuple[str, str]]:
    """Endless pairs: one of `own` with probability `own_share`, else the next demonstration."""
    rng = random.Random(seed)
    while True:
        yield rng.choice(own) if own and rng.random() < own_share else next(demonstrations)


def reward_pairs(
    domains: list[str], *, seed: int, rollouts: tuple[list[str], list[str]] | None = None
) -> Iterator[tuple[str, str]]:
    """Endless (judge prompt, verdict) pairs: branching steps, half good and half bad, and with
    `rollouts` ((good, bad) prompts from `rollout_examples`) ROLLOUT_SHARE of them drawn from those,
    good and bad in the share the policy played them (ROLLOUT_DRAW)."""
    expert = _branching_pairs(domains, seed=seed)
    rng = random.Random(seed + 1)
    good, bad = rollouts if rollouts is not None else ([], [])
    while True:
        if good and bad and rng.random() < ROLLOUT_SHARE:
            pick = rng.randrange(len(good) + len(bad))
            yield (good[pick], GOOD) if pick < len(good) else (bad[pick - len(good)], BAD)
        else:
            yield next(expert)


def _branching_pairs(domains: list[str], *, seed: int) -> Iterator[tuple[str, str]]:
    """Endless (judge prompt, verdict) pairs, half good steps and half bad ones, at states of the
    same walks the policy learns from (long histories, detours and invalid answers included)."""
    envs_by_domain = available_environments(domains)
    if not envs_by_domain:
        raise RuntimeError(f"no bootstrap domain available among {domains}")
    rng = random.Random(seed)
    names = sorted(envs_by_domain)
    pools: dict[str, list[str]] = {d: [] for d in names}  # responses seen in the domain: plausible mistakes
    want = 1
    while True:
        domain = rng.choice(names)
        env = envs_by_domain[domain]
        task = _task(env, rng)
        states = [(history, best, _mistake(episode, rng) if hasattr(env, "expert_response") else None)
                  for episode, history, best in _walk(env, task, rng)]  # fmt: skip
        if not states:
            continue
        pool = pools[domain]
        pool.extend(best for _, best, _ in states)
        del pool[:-512]
        history, best, mistake = states[rng.randrange(len(states))]
        if want == 1:
            candidate = best
        elif mistake is not None:
            candidate = mistake
        else:
            others = [r for r in pool if r.strip() != best.strip()]
            if not others:
                continue
            candidate = rng.choice(others)
        example = _judge_example(env, task, history, candidate, best)
        if example is None or example[1] != want:
            continue
        yield example[0], GOOD if want == 1 else BAD
        want = -want


def data_fingerprint(domains: list[str]) -> str:
    """Hash of the first bootstrap examples of `domains`: changes exactly when the data would."""
    import hashlib

    h = hashlib.sha256(json.dumps(sorted(available_environments(domains))).encode())
    for prompt, answer in itertools.islice(policy_pairs(domains, seed=0), 24):
        h.update(prompt.encode() + b"\0" + answer.encode() + b"\0")
    # enough judge prompts that some have long histories: a change to how those render must show
    for prompt, answer in itertools.islice(reward_pairs(domains, seed=0), 64):
        h.update(prompt.encode() + b"\0" + answer.encode() + b"\0")
    return h.hexdigest()[:16]


def corpus_texts(domains: list[str], *, seed: int, tasks_per_level: int = 12) -> Iterator[str]:
    """Tokenizer training text: prompts, oracle responses and labelled judge prompts of `domains`."""
    rng = random.Random(seed)
    for domain, env in sorted(available_environments(domains).items()):
        per_level = tasks_per_level if domain != "code" else 3  # code steps run the sandbox
        for level in _bootstrap_levels(env):
            for _ in range(per_level):
                task = _training_task(env, level, rng)
                for episode, _, response in _oracle_walk(env, task):
                    yield episode.prompt()
                    yield response
        pairs = reward_pairs([domain], seed=seed)
        for prompt, verdict in itertools.islice(pairs, 4 * per_level):
            yield prompt + "\n" + verdict


def sft(
    model: Any,
    tokenizer: Any,
    pairs: Iterator[tuple[str, str]],
    *,
    steps: int,
    seed: int,
    batch_size: int = 32,
    lr: float = 2e-3,
    prompt_loss: float = 0.0,
) -> dict[str, float]:
    """Supervised fine-tuning on (prompt, answer) pairs: the mean loss on answer tokens (and eos), plus
    `prompt_loss` times the mean loss on the prompt's tokens."""
    import torch
    import torch.nn.functional as F

    from infra.models.tokenizer import encode_prompt, encode_response

    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - 0.9 * min(s, steps) / steps)
    started, losses = time.perf_counter(), []
    for step in range(steps):
        batch: list[tuple[list[int], list[int]]] = []
        while len(batch) < batch_size:
            prompt, answer = next(pairs)
            p, a = encode_prompt(tokenizer, prompt), encode_response(tokenizer, answer)
            if len(p) + len(a) <= MAX_SFT_TOKENS:
                batch.append((p, a))
        width = max(len(p) + len(a) for p, a in batch)
        ids = torch.full((len(batch), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (p, a) in enumerate(batch):
            ids[i, : len(p) + len(a)] = torch.tensor(p + a)
            labels[i, len(p) : len(p) + len(a)] = torch.tensor(a)
            mask[i, : len(p) + len(a)] = 1
        if prompt_loss > 0:
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].flatten(0, 1)
            on_prompt = torch.full_like(labels, -100)
            for i, (p, _) in enumerate(batch):
                on_prompt[i, 1 : len(p)] = ids[i, 1 : len(p)]  # after <bos>
            loss = F.cross_entropy(logits, labels[:, 1:].flatten(), ignore_index=-100)
            loss = loss + prompt_loss * F.cross_entropy(logits, on_prompt[:, 1:].flatten(), ignore_index=-100)
        else:  # the model's own loss: the default presets' builds stay bit for bit what they were
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            log.info("bootstrap sft step %d/%d loss %.4f", step + 1, steps, losses[-1])
    model.eval()
    tail = losses[-20:]
    return {
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "seed": seed,
        "first_loss": losses[0],
        "final_loss": sum(tail) / len(tail),
        "seconds": time.perf_counter() - started,
    }


def verdict_accuracy(
    backend: Any, domains: list[str], *, examples: int, temperature: float, max_tokens: int, seed: int = 4242
) -> dict[str, float]:
    """How often a reward-model backend's verdict matches the oracle label on fresh judge prompts."""
    from envs.judging import parse_verdict

    pairs = list(itertools.islice(reward_pairs(domains, seed=seed), examples))
    outs = backend.generate([p for p, _ in pairs], temperature=temperature, max_tokens=max_tokens, seed=seed)
    verdicts = [parse_verdict(g[0].text) for g in outs]
    labels = [parse_verdict(answer) for _, answer in pairs]
    right = sum(v == y for v, y in zip(verdicts, labels, strict=True))
    return {
        "accuracy": right / len(pairs),
        "unparseable": verdicts.count(0) / len(pairs),
        "said_good": verdicts.count(1) / len(pairs),
    }


def reading_states(
    domains: list[str], *, states: int, levels: Iterable[int], seed: int = 99, unseen: bool = False
) -> list[tuple[str, list[str], str]]:
    """(prompt, listed actions, expert response) at `states` states of the demonstrations' own walks on
    training tasks of `levels` (where a domain has them; with `unseen`, on the pool of games the policy
    preset never trained on), in the domains that list their actions."""
    envs_by_domain = available_environments(domains)
    rng = random.Random(seed)
    out: list[tuple[str, list[str], str]] = []
    for _ in range(states):  # each walk gives at least one state, or its domain lists nothing
        if len(out) >= states or not envs_by_domain:
            break
        domain = rng.choice(sorted(envs_by_domain))
        env = envs_by_domain[domain]
        band = [level for level in levels if level in _bootstrap_levels(env)] or _bootstrap_levels(env)
        task = _training_task(env, rng.choice(band), rng, unseen=unseen)
        for episode, _, best in _walk(env, task, rng):
            if not hasattr(episode, "admissible"):
                del envs_by_domain[domain]
                break
            out.append((episode.prompt(), episode.admissible(), best))
    return out[:states]


def reading_shares(states: list[tuple[str, list[str], str]], answers: list[str]) -> dict[str, float]:
    """The share of `answers` (one per state) that name one of the state's listed actions, and the
    share that name the expert's."""
    listed = expert = 0
    for (_, actions, best), answer in zip(states, answers, strict=True):
        choice = parse_choice(answer, actions)
        listed += choice is not None
        expert += choice is not None and choice == parse_choice(best, actions)
    return {"listed": listed / len(states), "expert": expert / len(states)} if states else {}


def reading(
    backend: Any, domains: list[str], *, states: int, levels: Iterable[int], max_tokens: int
) -> dict[str, Any]:
    """How well a policy reads its list where it was taught: greedy answers to `reading_states`. The
    answer-only recipe's builds that learned to copy from the list and those that did not differ here
    by a quarter of the states, before any held-out game is played (`bootstrap.json` records it).
    Where the bootstrap draws from a pool of games, also on games outside it ("unseen"): TextWorld's
    policy preset named a listed command at 0.93 of its pool's states and lost 16 of 16 games outside
    it, most turns invalid; the gap is the pool's memorization."""
    result: dict[str, Any] = _reading(
        backend, reading_states(domains, states=states, levels=levels), max_tokens
    )
    if rollout_pool(domains) is not None:
        drawn = reading_states(domains, states=states, levels=levels, unseen=True)
        result["unseen"] = _reading(backend, drawn, max_tokens)
    log.info("reading: %s", result)
    return result


def _reading(backend: Any, drawn: list[tuple[str, list[str], str]], max_tokens: int) -> dict[str, Any]:
    if not drawn:
        return {"states": 0}
    outs = backend.generate([p for p, _, _ in drawn], temperature=0.0, max_tokens=max_tokens, seed=0)
    return {"states": len(drawn), **reading_shares(drawn, [g[0].text for g in outs])}
