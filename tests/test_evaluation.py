"""Held-out evaluation: interval arithmetic, summaries, process accuracy, and held-out seeds that
training never draws."""

from __future__ import annotations

import random

import pytest

from envs import get_environment
from envs.play import draw_until_valid, first_valid, play_tasks
from envs.seeds import HELDOUT_BASE, LEVEL_STRIDE, heldout_rng, heldout_seed, is_heldout, training_seed
from infra.models.types import Completion
from pipeline.evaluation import (
    PlayedEpisode,
    PlayedStep,
    majority,
    outcome_as_verdict,
    paired_comparison,
    process_accuracy,
    summarize_policy,
    wilson,
)

approx = pytest.approx


def test_wilson_hand_computed() -> None:
    # 20/40: z^2 = 3.841459, denom 1 + z^2/40 = 1.096036, centre 0.5,
    #   half = 1.959964 * sqrt(0.25/40 + z^2/6400) / denom = 0.148005
    assert wilson(20, 40) == approx((0.351995, 0.648005), abs=1e-6)
    # 0/40: centre = (z^2/80) / denom = 0.043811 = half -> [0, 0.087622]
    assert wilson(0, 40) == approx((0.0, 0.087622), abs=1e-6)
    # 7/10: denom 1.384146, centre (0.7 + 0.192073) / denom = 0.644493,
    #   half = 1.959964 * sqrt(0.021 + 0.0096037) / denom = 0.247720
    assert wilson(7, 10) == approx((0.396778, 0.892209), abs=1e-6)
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson(5, 4)


def test_majority_of_verdicts() -> None:
    assert majority([1, 1, -1]) == 1 and majority([-1, 0, -1]) == -1
    assert majority([1, -1, 0]) == 0 and majority([0, 0, 0]) == 0


def step(index: int, valid: bool = True, progress: bool | None = None) -> PlayedStep:
    return PlayedStep(
        index=index, judge_prompt=f"p{index}-{valid}-{progress}", valid=valid, progress=progress
    )


def test_summarize_policy_hand_computed() -> None:
    episodes = [
        PlayedEpisode(level=0, outcome=1, steps=[step(0), step(1)]),
        PlayedEpisode(
            level=0, outcome=-1, steps=[step(0, valid=False), step(1), step(2, valid=False), step(3)]
        ),
        PlayedEpisode(level=0, outcome=1, steps=[step(0, valid=False), step(1), step(2)]),
    ]
    out = summarize_policy(episodes)
    # 2 of 3 succeed; 3 invalid of 9 turns; 9 turns over 3 episodes
    assert out["tasks"] == 3 and out["successes"] == 2 and out["success"] == approx(2 / 3)
    assert (out["ci_low"], out["ci_high"]) == approx(wilson(2, 3))
    assert out["invalid_rate"] == approx(1 / 3) and out["mean_steps"] == approx(3.0)
    assert out["solved"] == "101"  # task by task, in play order


class ScriptedJudge:
    """A judge whose answers are fixed per prompt (to pin the arithmetic, not a model)."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers

    def generate(self, prompts, *, n=1, temperature, max_tokens, stop=None, seed=None):  # noqa: ANN001
        return [
            [
                Completion(
                    text=t, token_ids=[], logprobs=[], prompt_token_ids=[], finish_reason="stop", version=0
                )
                for t in self.answers[p][:n]
            ]  # fmt: skip
            for p in prompts
        ]


def test_process_accuracy_majority_against_labels() -> None:
    good, bad = "\\boxed{1}", "\\boxed{-1}"
    steps = [
        step(0, progress=True),  # majority good: right
        step(1, progress=False),  # majority good: wrong
        step(2, valid=False, progress=False),  # majority bad: right
        step(12, progress=False),  # tie (one unparseable): wrong
        step(3, progress=None),  # unlabelled: not counted
    ]
    judge = ScriptedJudge({
        steps[0].judge_prompt: [good, good, bad],
        steps[1].judge_prompt: [good, bad, good],
        steps[2].judge_prompt: [bad, bad, bad],
        steps[3].judge_prompt: [good, bad, "no idea"],
    })  # fmt: skip
    out = process_accuracy(judge, steps, m=3, temperature=0.8, max_tokens=8)
    assert out["steps"] == 4 and out["accuracy"] == approx(0.5)
    # good steps 1/1 right, bad steps 1/3 right -> balanced (1 + 1/3) / 2
    assert out["balanced_accuracy"] == approx(2 / 3)
    assert out["valid"] == {"steps": 3, "accuracy": approx(1 / 3)}
    assert out["invalid"] == {"steps": 1, "accuracy": 1.0}
    assert out["said_good"] == approx(0.5) and out["good_label_rate"] == approx(0.25)
    assert out["unparseable"] == approx(1 / 12)
    assert out["by_step"] == {"0": {"steps": 1, "accuracy": 1.0}, "1": {"steps": 1, "accuracy": 0.0},
                              "2-4": {"steps": 1, "accuracy": 1.0}, "10+": {"steps": 1, "accuracy": 0.0}}  # fmt: skip
    assert out["right"] == "1010"  # per labelled step, in order


def test_paired_comparison_is_mcnemars_exact_test() -> None:
    # A alone right on 1 step, B alone on 9, both right on 5, both wrong on 5 (20 steps):
    #   10 discordant steps; P(X <= 1), X ~ Bin(10, 1/2) = (1 + 10) / 1024; two-sided 22 / 1024
    a = "1" + "0" * 9 + "1" * 5 + "0" * 5
    b = "0" + "1" * 9 + "1" * 5 + "0" * 5
    out = paired_comparison(a, b)
    assert (out["items"], out["a_only"], out["b_only"]) == (20, 1, 9)
    assert out["difference"] == approx(8 / 20) and out["p_value"] == approx(22 / 1024)
    # 3 against 3 of 6 discordant: 2 * (1 + 6 + 15 + 20) / 64 > 1, so 1; the same judge twice: 1
    assert paired_comparison("111000", "000111")["p_value"] == 1.0
    assert paired_comparison("1100", "1100") == {
        "items": 4,
        "a_only": 0,
        "b_only": 0,
        "difference": 0.0,
        "p_value": 1.0,
    }
    # 0 against 5: 2 / 32
    assert paired_comparison("00000", "11111")["p_value"] == approx(1 / 16)
    with pytest.raises(ValueError, match="not the same items"):
        paired_comparison("10", "101")


def test_outcome_as_verdict_calls_each_step_its_episode_outcome() -> None:
    episodes = [
        # won: its good step is right, its bad step wrong
        PlayedEpisode(level=0, outcome=1, steps=[step(0, progress=True), step(1, progress=False)]),
        # lost: good steps wrong, bad step right, an unlabelled step not counted
        PlayedEpisode(
            level=0,
            outcome=-1,
            steps=[
                step(0, progress=True),
                step(1, progress=True),
                step(2, progress=False),
                step(3, progress=None),
            ],
        ),  # fmt: skip
    ]
    out = outcome_as_verdict(episodes)
    # 5 labelled steps, right: won-good, lost-bad -> 2 / 5; good steps 1 / 3 right, bad steps 1 / 2
    assert out["steps"] == 5 and out["accuracy"] == approx(0.4)
    assert out["balanced_accuracy"] == approx((1 / 3 + 1 / 2) / 2)
    assert out["said_good"] == approx(2 / 5) and out["good_label_rate"] == approx(3 / 5)
    assert outcome_as_verdict([PlayedEpisode(level=0, outcome=1, steps=[step(0, progress=None)])]) == {
        "steps": 0
    }


class ListReader:
    """A policy whose draws from one prompt are two unlisted actions, then the first listed one, however
    the draws are split over calls (to pin the redraw, not a model); it records each call's (prompts, n)."""

    def __init__(self) -> None:
        self.drawn: dict[str, int] = {}
        self.calls: list[tuple[int, int, int | None]] = []

    def generate(self, prompts, *, n=1, temperature, max_tokens, stop=None, seed=None):  # noqa: ANN001
        self.calls.append((len(prompts), n, seed))

        def draws(prompt: str) -> list[Completion]:
            listed = prompt.split("Actions:\n0: ", 1)[1].split("\n", 1)[0]
            texts = ["\\boxed{ fly to the moon}", "\\boxed{ 99}"] + [f"\\boxed{{ {listed}}}"] * 64
            start = self.drawn.get(prompt, 0)
            self.drawn[prompt] = start + n
            return [
                Completion(
                    text=t, token_ids=[], logprobs=[], prompt_token_ids=[], finish_reason="stop", version=0
                )
                for t in texts[start : start + n]
            ]

        return [draws(p) for p in prompts]


def test_redraw_plays_the_first_valid_answer_and_keeps_its_completion() -> None:
    env = get_environment("household")
    tasks = [env.sample_task(2, heldout_rng(2, i)) for i in range(2)]
    plain = play_tasks(ListReader(), env, tasks, temperature=0.8, max_tokens=8, max_steps=3, seed=0)
    assert [s.valid for e in plain for s in e.steps] == [False] * 6  # the first answer, unlisted
    redrawn = play_tasks(
        ListReader(), env, tasks, temperature=0.8, max_tokens=8, max_steps=3, seed=0, redraw=3
    )
    steps = [s for e in redrawn for s in e.steps]
    assert steps and all(s.valid for s in steps)
    assert all("moon" not in s.completion.text and "99" not in s.completion.text for s in steps)
    summary = summarize_policy(redrawn)
    assert summary["invalid_rate"] == 0.0


def test_redraw_decodes_draws_only_until_one_is_listed() -> None:
    """Two draws per prompt, then the rest of `redraw` for the prompts whose two named no listed action:
    each group ends at its first listed draw, and a group with none holds all `redraw` draws."""
    env = get_environment("household")
    episodes = [env.reset(env.sample_task(2, heldout_rng(2, i))) for i in range(3)]
    prompts = [e.prompt() for e in episodes]
    reader = ListReader()
    reader.drawn[prompts[1]] = 2  # the second prompt's next draws are listed
    reader.drawn[prompts[2]] = 1  # the third's first draw is unlisted, its second listed
    groups = draw_until_valid(reader, episodes, prompts, redraw=8, temperature=0.8, max_tokens=8, seed=5)
    # round 1: every prompt, two draws; round 2: the first prompt (unlisted, unlisted), six more of which
    # the first is listed: three draws kept, the last one played
    assert [(k, n) for k, n, _ in reader.calls] == [(3, 2), (1, 6)]
    assert len({seed for *_, seed in reader.calls}) == 2
    assert [len(g) for g in groups] == [3, 1, 2]
    assert [first_valid(e, g) for e, g in zip(episodes, groups, strict=True)] == [g[-1] for g in groups]
    none = ListReader()
    groups = draw_until_valid(
        none, episodes[:1], prompts[:1], redraw=2, temperature=0.8, max_tokens=8, seed=5
    )
    assert [n for _, n, _ in none.calls] == [2] and len(groups[0]) == 2  # none listed within 2
    assert first_valid(episodes[0], groups[0]) is groups[0][0]
    once = ListReader()
    assert (
        len(draw_until_valid(once, episodes, prompts, redraw=1, temperature=0.8, max_tokens=8, seed=5)[0])
        == 1
    )
    assert [n for _, n, _ in once.calls] == [1]


def test_redraw_needs_an_episode_that_lists_its_actions() -> None:
    env = get_environment("arith")
    episode = env.reset(env.sample_task(0, random.Random(0)))
    with pytest.raises(ValueError, match="admissible"):
        first_valid(
            episode, ListReader().generate(["x\nActions:\n0: a\n"], n=3, temperature=0.8, max_tokens=8)[0]
        )


# --- held-out seeds ---
def test_heldout_and_training_seed_ranges_are_disjoint() -> None:
    rng = random.Random(0)
    assert all(not is_heldout(training_seed(rng)) for _ in range(100_000))
    assert training_seed(random.Random(2**70)) < HELDOUT_BASE
    assert heldout_seed(0, 0) == HELDOUT_BASE and is_heldout(heldout_seed(9, LEVEL_STRIDE - 1))
    assert heldout_seed(1, 0) == HELDOUT_BASE + LEVEL_STRIDE  # levels never share a seed
    with pytest.raises(ValueError):
        heldout_seed(0, LEVEL_STRIDE)


def test_training_draws_every_task_from_the_training_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler's seeding and the bootstrap data sample each task from a training seed."""
    import envs.seeds
    import learners.bootstrap as bootstrap
    import producers.scheduler as scheduler

    drawn: list[int] = []

    def recording_rng(rng: random.Random) -> random.Random:
        seed = envs.seeds.training_seed(rng)
        drawn.append(seed)
        return random.Random(seed)

    monkeypatch.setattr(scheduler, "training_rng", recording_rng)
    monkeypatch.setattr(bootstrap, "training_rng", recording_rng)
    env = get_environment("household")
    tasks = scheduler.seed_tasks(env, 16, 3, random.Random(1))
    assert len(tasks) == 16 and len(drawn) >= 16
    next(bootstrap.policy_pairs(["household"], seed=0))
    next(bootstrap.reward_pairs(["household"], seed=0))
    assert len(drawn) >= 18 and all(seed < HELDOUT_BASE for seed in drawn)


def test_heldout_tasks_are_fixed_and_unlike_training_tasks() -> None:
    env = get_environment("household")
    level = 4
    heldout = [env.sample_task(level, heldout_rng(level, i)) for i in range(40)]
    again = [env.sample_task(level, heldout_rng(level, i)) for i in range(40)]
    assert [t.task_id for t in heldout] == [t.task_id for t in again]
    from producers.scheduler import seed_tasks

    training = seed_tasks(env, 200, level, random.Random(0))
    assert not {t.task_id for t in heldout} & {t.task_id for t in training}
    shared = {t.signature for t in heldout} & {t.signature for t in training}
    assert len(shared) <= 2, f"{len(shared)} held-out worlds also drawn in training at level {level}"
