"""Household domain: oracle, difficulty ladder, variants, determinism, invalid answers.

Pure unit tests (no broker); the whole file runs in a few seconds.
"""

from __future__ import annotations

import random
import statistics

import pytest

from envs.base import Environment, Episode, listed_prefix, parse_choice
from envs.household import HouseholdEnv, step_is_progress
from envs.household.env import JUDGE_HISTORY, preferred_easier_rules
from envs.household.tasks import oracle_length
from envs.household.world import object_type
from schemas.codec import decode, encode
from schemas.events import CriticFeedback, TaskSpec

TASKS_PER_LEVEL = 200
ENV = HouseholdEnv()

# Measured with this file's seeds (200 tasks per level, 3 uniform-random episodes per task, 40 steps),
# levels 0..9: random success 1.000 0.940 0.648 0.565 0.383 0.273 0.175 0.082 0.032 0.000;
# mean oracle length 2.00 2.00 2.00 2.31 3.22 3.79 4.47 4.89 6.36 8.56 (max 2 2 2 4 4 4 6 8 11 14).


def tasks_at(level: int, n: int = TASKS_PER_LEVEL, seed: int = 0) -> list[TaskSpec]:
    rng = random.Random(1000 * level + seed)
    return [ENV.sample_task(level, rng) for _ in range(n)]


def random_success(tasks: list[TaskSpec], seed: int = 0, episodes_per_task: int = 1) -> float:
    """Success rate of a uniform-random choice among the admissible actions."""
    wins = 0
    for k, task in enumerate(tasks):
        rng = random.Random(seed * 100_003 + k)
        for _ in range(episodes_per_task):
            episode = ENV.reset(task)
            while not episode.done:
                episode.step(f"\\boxed{{{rng.randrange(len(episode.admissible()))}}}")
            wins += episode.outcome == 1
    return wins / (len(tasks) * episodes_per_task)


@pytest.fixture(scope="module")
def ladder() -> dict[int, list[TaskSpec]]:
    return {level: tasks_at(level) for level in range(ENV.levels)}


def test_protocols_and_levels() -> None:
    assert isinstance(ENV, Environment)
    assert ENV.domain == "household" and ENV.levels >= 5
    task = ENV.sample_task(0, random.Random(1))
    assert isinstance(ENV.reset(task), Episode)
    assert task.status == "active" and task.signature == ENV.signature(task)


def test_level_zero_is_one_room_pick_and_place_in_sight() -> None:
    for task in tasks_at(0, 50):
        p = task.params
        assert len(p["rooms"]) == 1 and p["goal"]["kind"] == "place"
        assert not any(r.get("openable") for r in p["receptacles"])
        assert len(ENV.oracle(task)) == 2  # take, put


def test_oracle_solves_every_level(ladder: dict[int, list[TaskSpec]]) -> None:
    for level, tasks in ladder.items():
        for task in tasks:
            episode = ENV.reset(task)
            responses = ENV.oracle(task)
            for response in responses:
                assert not episode.done
                assert episode.step(response).valid_action
            assert episode.done and episode.outcome == 1, (level, task.params)
            assert len(responses) <= task.params["max_steps"]


def test_random_policy_success_falls_with_difficulty(ladder: dict[int, list[TaskSpec]]) -> None:
    success = [random_success(tasks, episodes_per_task=3) for tasks in ladder.values()]
    lengths = [statistics.mean(len(ENV.oracle(t)) for t in tasks) for tasks in ladder.values()]
    for easier, harder in zip(success, success[1:], strict=False):
        assert harder < easier, success
    assert success[0] >= 0.9 and success[-1] <= 0.05, success
    assert lengths[-1] > lengths[0] + 4, lengths
    for easier, harder in zip(lengths, lengths[1:], strict=False):
        assert harder >= easier - 0.05, lengths


def test_every_task_kind_appears_on_the_ladder(ladder: dict[int, list[TaskSpec]]) -> None:
    kinds = {t.params["goal"]["kind"] for tasks in ladder.values() for t in tasks}
    assert kinds == {"place", "pick_two", "clean", "heat", "cool", "examine"}


def test_prompt_is_compact_and_numbered_in_sorted_order() -> None:
    rng = random.Random(3)
    for level in range(ENV.levels):
        for _ in range(20):
            episode = ENV.reset(ENV.sample_task(level, rng))
            prompt = episode.prompt()
            assert prompt.startswith("Task: ") and prompt.endswith("answer with \\boxed{action}.")
            assert len(prompt.split()) <= 130, prompt
            actions = episode.admissible()
            assert actions == sorted(actions)
            for i, text in enumerate(actions):
                assert f"\n{i}: {text}\n" in prompt


def hand_built(params: dict) -> TaskSpec:
    """A household task from hand-written params (at level 3; the level does not change the play)."""
    return TaskSpec(task_id="t", domain="household", difficulty=3, seed=0, params=params)


def test_closed_receptacles_hide_their_contents() -> None:
    task = hand_built(
        {
            "rooms": ["kitchen"],
            "start": "kitchen",
            "receptacles": [
                {"name": "drawer 1", "room": "kitchen", "openable": True, "closed": True},
                {"name": "table 1", "room": "kitchen"},
            ],
            "objects": [{"name": "apple 1", "at": "drawer 1"}, {"name": "mug 1", "at": "table 1"}],
            "goal": {"kind": "place", "object": "apple", "target": "table 1"},
        }
    )
    episode = ENV.reset(task)
    assert "drawer 1 (closed)" in episode.prompt() and "apple" not in episode.prompt().split("Actions:")[1]
    assert episode.admissible() == ["open drawer 1", "take mug 1 from table 1"]
    result = episode.step("\\boxed{0}")
    assert "apple 1" in result.observation and "drawer 1 (apple 1)" in episode.prompt()
    assert ENV.oracle(task) == [
        "\\boxed{ open drawer 1}",
        "\\boxed{ take apple 1 from drawer 1}",
        "\\boxed{ put apple 1 in table 1}",
    ]
    assert episode.world.distance(episode.world.initial) == 3


def test_rebuild_from_spec_is_deterministic() -> None:
    for level in range(ENV.levels):
        a = ENV.sample_task(level, random.Random(level))
        b = ENV.sample_task(level, random.Random(level))
        assert a.params == b.params and a.task_id == b.task_id
        wire = decode(encode(a), TaskSpec)  # what another process receives
        assert ENV.signature(wire) == ENV.signature(a)
        assert ENV.oracle(wire) == ENV.oracle(a)
        e1, e2 = ENV.reset(a), ENV.reset(wire)
        rng = random.Random(7)
        while not e1.done:
            assert e1.prompt() == e2.prompt()
            response = f"\\boxed{{{rng.randrange(len(e1.admissible()))}}}"
            assert e1.step(response) == e2.step(response)
        assert e1.outcome == e2.outcome and e2.done


def test_signature_ignores_seed_order_and_defaults() -> None:
    task = ENV.sample_task(6, random.Random(5))
    params = dict(task.params)
    params["receptacles"] = list(reversed(params["receptacles"]))
    params["objects"] = list(reversed(params["objects"]))
    same = TaskSpec(task_id="other", domain="household", difficulty=0, seed=99, params=params)
    assert ENV.signature(same) == ENV.signature(task)
    changed = dict(
        params, goal=dict(params["goal"], kind="examine" if params["goal"]["kind"] != "examine" else "place")
    )
    assert ENV.signature_of(changed) != ENV.signature(task)


def test_invalid_answers_count_as_steps_and_say_so() -> None:
    task = ENV.sample_task(1, random.Random(2))
    episode = ENV.reset(task)
    n = len(episode.admissible())
    for bad in [
        "take the apple",
        f"\\boxed{{{n}}}",
        "\\boxed{-1}",
        "\\boxed{}",
        "boxed{0}",
        "\\boxed{go to mars}",
    ]:
        before = episode.state
        result = episode.step(bad)
        assert not result.valid_action and result.observation.startswith("Invalid answer")
        assert episode.state == before
    assert (
        episode.prompt().count("Invalid answer") == 1
        and "Last actions: invalid; invalid." in episode.prompt()
    )
    assert len(episode.actions_taken) == 6
    while not episode.done:
        episode.step("no idea")
    assert len(episode.actions_taken) == task.params["max_steps"] == 40 and episode.outcome == -1
    with pytest.raises(RuntimeError):
        episode.step("\\boxed{0}")


def test_an_invalid_answer_says_how_much_of_it_still_spelled_a_listed_action() -> None:
    actions = ["go to kitchen", "open drawer 1", "take apple 1 from table 1"]
    # "\\boxed{ take apple 1 from " (26 characters) is the start of a listed answer; "drawer" is not
    assert listed_prefix("\\boxed{ take apple 1 from drawer 2}", actions) == 26
    assert listed_prefix("\\boxed{ fly}", actions) == 8  # the box and its space
    assert listed_prefix("I think \\boxed{ go to mars}", actions) == 8 + len("\\boxed{ go to ")
    assert listed_prefix("no box at all", actions) == 0
    task = ENV.sample_task(1, random.Random(2))
    episode = ENV.reset(task)
    listed = episode.admissible()[0]
    result = episode.step(f"\\boxed{{ {listed} and more}}")
    assert not result.valid_action and result.info["listed_prefix"] == len(f"\\boxed{{ {listed}")


def test_an_answer_names_a_listed_action_by_text_or_number_and_the_last_box_counts() -> None:
    actions = ["go to kitchen", "open drawer 1", "take apple 1 from table 1", "x"]
    assert parse_choice("maybe \\boxed{1} no \\boxed{ 3 }", actions) == 3
    assert parse_choice("\\boxed{0} I will \\boxed{ Open  Drawer 1. }", actions) == 1
    assert parse_choice("\\boxed{take apple 1 from table 1}", actions) == 2
    for bad in [
        "\\boxed{4}",
        "\\boxed{-1}",
        "\\boxed{open drawer}",
        "\\boxed{take apple 1}",
        "open drawer 1",
    ]:
        assert parse_choice(bad, actions) is None, bad


def test_max_steps_is_a_task_param() -> None:
    task = ENV.sample_task(2, random.Random(4))
    short = TaskSpec(
        task_id="s", domain="household", difficulty=2, seed=0, params={**task.params, "max_steps": 3}
    )
    episode = ENV.reset(short)
    for _ in range(3):
        episode.step("?")
    assert episode.done and episode.outcome == -1


def test_judge_context_shows_history_and_the_choices() -> None:
    task = ENV.sample_task(5, random.Random(8))
    episode = ENV.reset(task)
    responses = ENV.oracle(task)
    for r in responses:
        episode.step(r)
    context = episode.judge_context(1)
    first = episode.actions_taken[0]
    assert context.startswith("Task: ") and f"1. {first}" in context
    assert episode.actions_taken[1] in context.split("Actions:")[1]  # the choice at step 1 is listed
    assert "Previous actions: none." in episode.judge_context(0)


def test_step_is_progress_labels_oracle_steps_and_detours() -> None:
    rng = random.Random(11)
    for level in (0, 4, 7, 9):
        for task in tasks_at(level, 20, seed=1):
            responses = ENV.oracle(task)
            for i, response in enumerate(responses):
                assert step_is_progress(task, responses[:i], response)
            assert not step_is_progress(task, [], "\\boxed{99}")
            episode = ENV.reset(task)
            for i, text in enumerate(episode.admissible()):
                if text.startswith("close ") or (
                    text.startswith("take ") and task.params["goal"]["object"] not in text
                ):
                    assert not step_is_progress(task, [], f"\\boxed{{{i}}}")
    del rng


@pytest.mark.parametrize("direction", ["harder", "easier"])
def test_variants_move_difficulty_in_the_stated_direction(direction: str) -> None:
    rng = random.Random(21)
    parents: list[TaskSpec] = []
    children: list[TaskSpec] = []
    for level in range(ENV.levels):
        for task in tasks_at(level, 30, seed=2):
            child = ENV.propose_variant(task, direction, CriticFeedback(), rng)  # type: ignore[arg-type]
            if child is None:
                assert direction == "easier" and level == 0
                continue
            assert child.status == "pending" and child.parent_id == task.task_id
            assert child.direction == direction and child.generation == task.generation + 1
            assert child.task_id != task.task_id and child.signature == ENV.signature(child)
            assert child.signature != task.signature
            parents.append(task)
            children.append(child)
    sign = 1 if direction == "harder" else -1
    deltas = [
        oracle_length(c.params) - oracle_length(p.params) for p, c in zip(parents, children, strict=True)
    ]
    assert all(d * sign >= 0 for d in deltas)
    assert all(oracle_length(c.params) >= 1 for c in children)  # never an already-solved task
    assert sum(d * sign > 0 for d in deltas) >= 0.5 * len(deltas), deltas
    # random-policy success moves the other way (harder -> lower), measured over every pair
    before, after = random_success(parents, seed=3), random_success(children, seed=3)
    assert (before - after) * sign > 0.05, (before, after)
    for child in children[:40]:  # variants are solvable by the oracle too
        episode = ENV.reset(child)
        for r in ENV.oracle(child):
            episode.step(r)
        assert episode.outcome == 1


def goal_hidden(task: TaskSpec) -> bool:
    closed = {r["name"] for r in task.params["receptacles"] if r.get("closed")}
    return any(
        o["at"] in closed
        for o in task.params["objects"]
        if object_type(o["name"]) == task.params["goal"]["object"]
    )


def test_easier_variant_follows_the_critic() -> None:
    rng = random.Random(5)
    opened = merged = 0
    tasks = [t for t in tasks_at(6, 60, seed=4) if goal_hidden(t)]
    assert len(tasks) >= 10
    for task in tasks:
        critic = CriticFeedback(high_risk_steps=[[1]], failed_actions=["I will open drawer 1. \\boxed{2}"])
        child = ENV.propose_variant(task, "easier", critic, rng)
        assert child is not None
        opened += child.params["origin"] in ("open_all", "object_in_sight")
        go = CriticFeedback(high_risk_steps=[[0]], failed_actions=["I will go to kitchen. \\boxed{0}"])
        merged += ENV.propose_variant(task, "easier", go, rng).params["origin"] in (
            "merge_rooms",
            "object_in_sight",
        )
    assert opened == len(tasks) and merged == len(tasks), (opened, merged, len(tasks))


def test_critic_rules_without_verbs_follow_the_high_risk_step_position() -> None:
    early = CriticFeedback(high_risk_steps=[[0], [1]], failed_actions=["\\boxed{1}", "\\boxed{0}"])
    late = CriticFeedback(high_risk_steps=[[5], [4, 5]], failed_actions=["\\boxed{1}"] * 3)
    assert preferred_easier_rules(early, 6)[0] == "object_in_sight"
    assert preferred_easier_rules(late, 6)[0] == "task_type"
    assert preferred_easier_rules(CriticFeedback(), 6) == []


def test_judge_context_keeps_the_last_actions_numbered_from_the_start() -> None:
    task = ENV.sample_task(4, random.Random(3))
    episode = ENV.reset(task)
    for _ in range(JUDGE_HISTORY + 3):
        episode.step("\\boxed{0}")
    context = episode.judge_context(JUDGE_HISTORY + 3)
    history = context.split("Previous actions: ")[1].split(".\n")[0]
    shown = [part.split(". ", 1)[0] for part in history.split("; ")]
    assert shown == [str(i) for i in range(4, JUDGE_HISTORY + 4)]  # actions 4..11 of 11


def test_a_search_step_explores_until_a_goal_object_is_in_view() -> None:
    """Seed 1, level 4: 'put a spoon in countertop 1'; the spoon is in closed dresser 1, next to closed
    cabinet 1 and dresser 2. Opening cabinet 1 first is a detour in hindsight but a search step; once
    dresser 1 is open the spoon is in view, and opening cabinet 1 is a detour by both labels."""
    from envs.household import step_explores

    env = HouseholdEnv()
    task = env.sample_task(4, random.Random(1))
    assert task.params["goal"] == {"kind": "place", "object": "spoon", "target": "countertop 1"}
    assert env.oracle(task)[0] == "\\boxed{ open dresser 1}"
    cabinet = "\\boxed{0}"  # open cabinet 1
    assert not step_is_progress(task, [], cabinet) and step_explores(task, [], cabinet)
    opened = ["\\boxed{ open dresser 1}"]
    cabinet_now = "\\boxed{1}"  # the list is renumbered: close dresser 1, open cabinet 1, ...
    episode = env.reset(task)
    episode.step(opened[0])
    assert "spoon 1" in episode.prompt() and episode.admissible()[1] == "open cabinet 1"
    assert not step_is_progress(task, opened, cabinet_now) and not step_explores(task, opened, cabinet_now)
    assert not step_explores(task, [], "\\boxed{9}") and not step_explores(task, [], "no answer")


def test_the_searching_expert_looks_before_it_takes_and_finds_the_target_room() -> None:
    """A kitchen with two closed drawers (the apple in drawer 2) and a hall holding the target. The
    omniscient expert opens drawer 2 at once; the searching one opens the nearer-by-name drawer 1
    first, takes the apple once it has seen it, and enters the hall it has never seen to find the
    table. Its labels on the way are listed actions."""
    task = hand_built(
        {
            "rooms": ["hall", "kitchen"],
            "doors": [["hall", "kitchen"]],
            "start": "kitchen",
            "receptacles": [
                {"name": "drawer 1", "room": "kitchen", "openable": True, "closed": True},
                {"name": "drawer 2", "room": "kitchen", "openable": True, "closed": True},
                {"name": "table 1", "room": "hall"},
            ],
            "objects": [{"name": "apple 1", "at": "drawer 2"}],
            "goal": {"kind": "place", "object": "apple", "target": "table 1"},
        }
    )
    omniscient, searching = HouseholdEnv(), HouseholdEnv(expert="searching")
    assert omniscient.expert_response(omniscient.reset(task)) == "\\boxed{ open drawer 2}"
    episode = searching.reset(task)
    played = []
    while (answer := searching.expert_response(episode)) is not None:
        assert answer[len("\\boxed{ ") : -1] in episode.admissible()
        played.append(answer)
        episode.step(answer)
    assert played == [
        "\\boxed{ open drawer 1}",
        "\\boxed{ open drawer 2}",
        "\\boxed{ take apple 1 from drawer 2}",
        "\\boxed{ go to hall}",
        "\\boxed{ put apple 1 in table 1}",
    ]
    assert episode.outcome == 1


def test_the_searching_expert_solves_every_level(ladder: dict[int, list[TaskSpec]]) -> None:
    """From the start and within the step limit, at most a few steps longer than the oracle on average."""
    env = HouseholdEnv(expert="searching")
    for level, tasks in ladder.items():
        extra = []
        for task in tasks:
            episode = env.reset(task)
            while (answer := env.expert_response(episode)) is not None:
                episode.step(answer)
            assert episode.outcome == 1, (level, task.task_id)
            extra.append(len(episode.actions_taken) - oracle_length(task.params))
        assert min(extra) >= 0 and statistics.mean(extra) <= 3, (level, extra)
