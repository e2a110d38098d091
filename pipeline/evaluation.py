"""Held-out evaluation: a policy's success and a reward model's process accuracy.

Tasks come from `envs.seeds.heldout_rng` (seeds no training draws). Per level and decoding mode:
success with a 95 % Wilson interval, the rate of invalid answers (turns the environment could not
parse into an admissible action), and mean steps. Process accuracy (the paper's measure of the
reward model) is the agreement of the majority of m verdicts with the environment's own step label
(`step_is_progress`: the step brings the oracle distance down) on held-out trajectories the policy
plays, split by step index and by whether the step's answer was valid. A tie or an unparseable
majority counts as a wrong verdict.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from envs import get_environment, parse_verdict
from envs.play import PlayedEpisode, PlayedStep, play_tasks
from envs.seeds import heldout_rng

Z95 = 1.959963984540054
JUDGE_CHUNK = 32  # judge prompts per generate call (x m rows): keeps the KV cache small


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) when n = 0."""
    if n == 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes out of {n}")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def majority(verdicts: Iterable[int]) -> int:
    """+1 / -1 when strictly more verdicts say so than the opposite, else 0 (tie or unparseable)."""
    total = sum(1 if v > 0 else -1 if v < 0 else 0 for v in verdicts)
    return (total > 0) - (total < 0)


def play_heldout(
    backend: Any,
    domain: str,
    level: int,
    count: int,
    *,
    temperature: float,
    max_tokens: int,
    max_steps: int = 40,
    seed: int = 0,
    parallel: int = 16,
    first_task: int = 0,
    redraw: int = 1,
) -> list[PlayedEpisode]:
    """Play held-out tasks first_task .. first_task+count-1 of `level`, batching `parallel` episodes;
    `redraw` > 1 plays the first valid of that many answers per turn (`envs.play.play_tasks`)."""
    env = get_environment(domain)
    played: list[PlayedEpisode] = []
    for start in range(first_task, first_task + count, parallel):
        tasks = [
            env.sample_task(level, heldout_rng(level, i))
            for i in range(start, min(start + parallel, first_task + count))
        ]
        played += play_tasks(backend, env, tasks, temperature=temperature, max_tokens=max_tokens,
                             max_steps=max_steps, seed=seed + start * max_steps, redraw=redraw)  # fmt: skip
    return played


def summarize_policy(episodes: list[PlayedEpisode]) -> dict[str, float | int]:
    """Success (with its 95 % Wilson interval), invalid-answer rate over turns, mean steps, and
    `solved`, one character per task in order ("1": won), for `paired_comparison` of two policies on
    the same held-out tasks."""
    n = len(episodes)
    wins = sum(e.outcome == 1 for e in episodes)
    turns = sum(len(e.steps) for e in episodes)
    low, high = wilson(wins, n)
    return {
        "tasks": n,
        "successes": wins,
        "success": wins / n if n else 0.0,
        "ci_low": low,
        "ci_high": high,
        "invalid_rate": sum(e.invalid for e in episodes) / turns if turns else 0.0,
        "mean_steps": turns / n if n else 0.0,
        "solved": "".join("1" if e.outcome == 1 else "0" for e in episodes),
    }


def evaluate_policy(
    backend: Any,
    domain: str,
    levels: list[int],
    tasks_per_level: int,
    *,
    temperatures: dict[str, float],
    max_tokens: int,
    max_steps: int = 40,
    seed: int = 0,
    redraws: dict[str, int] | None = None,
) -> dict[str, dict[str, dict[str, float | int]]]:
    """{mode: {level: summary}} for each decoding mode (e.g. {"sampled": 0.8, "greedy": 0.0});
    `redraws[mode]` > 1 plays the first valid of that many answers per turn in that mode."""
    return {
        mode: {
            str(level): summarize_policy(
                play_heldout(
                    backend,
                    domain,
                    level,
                    tasks_per_level,
                    temperature=t,
                    max_tokens=max_tokens,
                    max_steps=max_steps,
                    seed=seed,
                    redraw=(redraws or {}).get(mode, 1),
                )  # fmt: skip
            )
            for level in levels
        }
        for mode, t in temperatures.items()
    }


def process_accuracy(
    judge: Any, steps: list[PlayedStep], *, m: int, temperature: float, max_tokens: int, seed: int = 0
) -> dict[str, Any]:
    """Agreement of the majority of m verdicts with the step labels: overall, by step index bucket
    and by valid / invalid answer; balanced accuracy (labels are mostly "bad" for a weak policy); how
    often the majority says "good" and the unparseable rate; `right`, one character per labelled step
    in order ("1": the majority agreed), for `paired_comparison` of two judges on the same steps."""
    labelled = [s for s in steps if s.progress is not None]
    if not labelled:
        return {"steps": 0}
    verdicts: list[list[int]] = []
    for lo in range(0, len(labelled), JUDGE_CHUNK):  # bounded batches: one generate per chunk
        outs = judge.generate([s.judge_prompt for s in labelled[lo : lo + JUDGE_CHUNK]], n=m,
                              temperature=temperature, max_tokens=max_tokens, seed=seed + lo)  # fmt: skip
        verdicts += [[parse_verdict(c.text) for c in group] for group in outs]
    right = [majority(v) == (1 if s.progress else -1) for s, v in zip(labelled, verdicts, strict=True)]
    return {
        **_agreement([bool(s.progress) for s in labelled], right),
        "said_good": sum(majority(v) == 1 for v in verdicts) / len(verdicts),
        "unparseable": sum(v.count(0) for v in verdicts) / (m * len(verdicts)),
        "valid": _share(right, [s.valid for s in labelled]),
        "invalid": _share(right, [not s.valid for s in labelled]),
        "by_step": _by_step(labelled, right),
        "right": "".join("1" if r else "0" for r in right),
    }


def paired_comparison(a: str, b: str) -> dict[str, float | int]:
    """B against A on the same items: two judges' `right` strings on the same steps, or two policies'
    `solved` strings on the same tasks. The items only A got, only B got, B's rate minus A's, and
    McNemar's exact two-sided p. Items both got or both missed say nothing about which is better;
    under "equally good" each of the others is a fair coin, so p is twice the chance of a split at
    least as uneven as the one seen (at most 1)."""
    if len(a) != len(b):
        raise ValueError(f"not the same items: {len(a)} against {len(b)}")
    a_only = sum(x == "1" and y == "0" for x, y in zip(a, b, strict=True))
    b_only = sum(x == "0" and y == "1" for x, y in zip(a, b, strict=True))
    discordant = a_only + b_only
    tail = sum(math.comb(discordant, i) for i in range(min(a_only, b_only) + 1)) / 2**discordant
    return {
        "items": len(a),
        "a_only": a_only,
        "b_only": b_only,
        "difference": (b_only - a_only) / len(a) if a else 0.0,
        "p_value": min(1.0, 2 * tail),
    }


def outcome_as_verdict(episodes: list[PlayedEpisode]) -> dict[str, Any]:
    """Process accuracy of a judge that calls every step of a won episode good and every step of a lost
    one bad. With m = 3 verdicts and λ < 3 the consistency reward's advantages are those of the outcome
    alone (λ = 0; pinned in test_algorithm), so this is where co-training leads the reward model: above
    its start, co-training can raise process accuracy; below it, co-training pulls it down."""
    labelled = [(s, e.outcome > 0) for e in episodes for s in e.steps if s.progress is not None]
    if not labelled:
        return {"steps": 0}
    right = [won == s.progress for s, won in labelled]
    return {
        **_agreement([bool(s.progress) for s, _ in labelled], right),
        "said_good": sum(won for _, won in labelled) / len(labelled),
    }


def _share(right: list[bool], mask: list[bool]) -> dict[str, float | int]:
    picked = [r for r, keep in zip(right, mask, strict=True) if keep]
    return {"steps": len(picked), "accuracy": sum(picked) / len(picked) if picked else 0.0}


def _agreement(good: list[bool], right: list[bool]) -> dict[str, float | int]:
    """Accuracy, balanced accuracy (the mean of the accuracies on good and on bad steps: a judge that
    always says "bad" scores 0.5) and the share of good labels."""
    return {
        "steps": len(right),
        "accuracy": sum(right) / len(right),
        "balanced_accuracy": (
            _share(right, good)["accuracy"] + _share(right, [not g for g in good])["accuracy"]
        )
        / 2,
        "good_label_rate": sum(good) / len(good),
    }


def _by_step(steps: list[PlayedStep], right: list[bool]) -> dict[str, dict[str, float | int]]:
    """Accuracy by step index in buckets 0, 1, 2-4, 5-9, 10+ (the index within its episode)."""
    out: dict[str, list[bool]] = {}
    for step, ok in zip(steps, right, strict=True):
        out.setdefault(_bucket(step.index), []).append(ok)
    return {
        name: {"steps": len(oks), "accuracy": sum(oks) / len(oks)}
        for name, oks in sorted(out.items(), key=lambda kv: STEP_BUCKETS.index(kv[0]))
    }


STEP_BUCKETS = ("0", "1", "2-4", "5-9", "10+")


def _bucket(index: int) -> str:
    return (
        "0" if index == 0 else "1" if index == 1 else "2-4" if index < 5 else "5-9" if index < 10 else "10+"
    )
