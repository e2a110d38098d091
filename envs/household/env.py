"""HouseholdEnv: the AlfWorld-like multi-turn domain behind `envs.base.Environment`.

Each turn the policy sees a compact observation (task, room, held object, receptacles in sight
with closed ones hiding their contents, exits, last two actions) and the admissible actions
numbered in sorted order, and answers `\\boxed{action}`: the action's text, or its number. Outcome
+1 iff the goal is reached within `max_steps` turns (an answer that names no listed action is an
invalid turn that still counts).

Invariant: everything is a pure function of `TaskSpec.params`; the oracle is a BFS over world states.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from typing import Any, Literal

from envs.base import ANSWER_INSTRUCTION, Direction, StepResult, boxed, listed_prefix, parse_choice
from envs.household.tasks import (
    EASIER_FOR_VERB,
    EASIER_WHEN_EARLY,
    EASIER_WHEN_LATE,
    LADDER,
    easier_moves,
    harder_moves,
    oracle_length,
    sample_params,
)
from envs.household.world import State, World, describe_object
from schemas.events import CriticFeedback, TaskSpec

INSTRUCTION = ANSWER_INSTRUCTION
INVALID = "Invalid answer: reply with \\boxed{action} naming a listed action."
# The judge sees the state in full (room, hands, receptacles) and only the latest actions: enough to
# tell an undo or a repeat, and a 40-step episode's last prompts stay short (judging one such episode
# took 3x as long with the whole history, most of it in attention over the long prompts).
JUDGE_HISTORY = 8


class HouseholdEpisode:
    """One play-through of a household task (implements `envs.base.Episode`)."""

    def __init__(self, task: TaskSpec) -> None:
        self.task = task
        self.world = World(task.params)
        self.max_steps = self.world.max_steps
        self.state: State = self.world.initial
        self.states: list[State] = [self.state]  # state before each turn (and after the last)
        self.actions_taken: list[str | None] = []  # action text per turn, None for an invalid answer
        self.feedback: list[str] = []
        self._achieved = self.world.achieved(self.state)

    # --- what the policy sees ---
    def admissible(self) -> list[str]:
        return [text for text, _ in self.world.actions(self.state)]

    def describe(self, s: State) -> str:
        w = self.world
        held = describe_object(w.obj_names[s.held], s.flags[s.held]) if s.held >= 0 else "nothing"
        seen = []
        for r in w.room_recs[s.loc]:
            if w.rec_kind[r] == "lamp":
                seen.append(w.rec_names[r])
            elif w.rec_openable[r] and not w.is_open(s, r):
                seen.append(f"{w.rec_names[r]} (closed)")
            else:
                inside = ", ".join(describe_object(w.obj_names[o], s.flags[o]) for o in w.contents(s, r))
                seen.append(f"{w.rec_names[r]} ({inside or 'empty'})")
        exits = ", ".join(w.rooms[n] for n in w.exits[s.loc]) or "none"
        return f"You are in {w.rooms[s.loc]}. You hold {held}.\nYou see: {'; '.join(seen)}.\nExits: {exits}."

    def _numbered(self, s: State) -> str:
        return "\n".join(f"{i}: {text}" for i, (text, _) in enumerate(self.world.actions(s)))

    def prompt(self) -> str:
        recent = [a if a is not None else "invalid" for a in self.actions_taken[-2:]]
        lines = [
            f"Task: {self.world.goal_text()}",
            self.describe(self.state),
            f"Last actions: {'; '.join(recent) if recent else 'none'}.",
        ]
        if self.actions_taken and self.actions_taken[-1] is None:
            lines.append(INVALID)
        lines += ["Actions:", self._numbered(self.state), INSTRUCTION]
        return "\n".join(lines)

    # --- acting ---
    def step(self, response: str) -> StepResult:
        if self.done:
            raise RuntimeError("step() on a finished episode")
        actions = self.world.actions(self.state)
        index = parse_choice(response, [text for text, _ in actions])
        if index is None:
            self.actions_taken.append(None)
            self.feedback.append(INVALID)
            self.states.append(self.state)
            observation = f"{INVALID}\n{self.describe(self.state)}"
            names = [text for text, _ in actions]
            return StepResult(observation, self.done, valid_action=False,
                              info={"action": None, "listed_prefix": listed_prefix(response, names)})  # fmt: skip
        text, op = actions[index]
        self.state, said = self.world.apply(self.state, op)
        self._achieved = self.world.achieved(self.state)
        if self._achieved:
            said += " Task done."
        self.actions_taken.append(text)
        self.feedback.append(said)
        self.states.append(self.state)
        observation = f"{said}\n{self.describe(self.state)}"
        return StepResult(observation, self.done, info={"action": text, "achieved": self._achieved})

    @property
    def done(self) -> bool:
        return self._achieved or len(self.actions_taken) >= self.max_steps

    @property
    def outcome(self) -> Literal[1, -1]:
        return 1 if self._achieved else -1

    def judge_context(self, step_index: int) -> str:
        """Task, the last JUDGE_HISTORY actions before `step_index` (numbered from the episode's start),
        and the observation with the numbered actions the policy chose from at `step_index` (so the
        judge can decode an answer by number)."""
        step_index = min(step_index, len(self.states) - 1)
        done = [a if a is not None else "invalid" for a in self.actions_taken[:step_index]]
        first = max(0, len(done) - JUDGE_HISTORY)
        history = "; ".join(f"{i + 1}. {a}" for i, a in enumerate(done) if i >= first) or "none"
        s = self.states[step_index]
        return (
            f"Task: {self.world.goal_text()}\nPrevious actions: {history}.\n{self.describe(s)}\n"
            f"Actions:\n{self._numbered(s)}"
        )


def _canonical(params: dict[str, Any]) -> dict[str, Any]:
    recs = [
        {
            "name": r["name"],
            "room": r["room"],
            "kind": r.get("kind", "plain"),
            "openable": bool(r.get("openable", False)),
            "closed": bool(r.get("openable", False) and r.get("closed", False)),
        }
        for r in params["receptacles"]
    ]
    return {
        "rooms": sorted(params["rooms"]),
        "doors": sorted(sorted(d) for d in params.get("doors", [])),
        "start": params["start"],
        "receptacles": sorted(recs, key=lambda r: r["name"]),
        "objects": sorted(
            ({"name": o["name"], "at": o["at"], "flags": int(o.get("flags", 0))} for o in params["objects"]),
            key=lambda o: o["name"],
        ),
        "goal": {k: params["goal"][k] for k in ("kind", "object", "target")},
        "max_steps": int(params.get("max_steps", 40)),
    }


def preferred_easier_rules(critic: CriticFeedback, solution_length: int) -> list[str]:
    """Easier rules that remove the complication at the critic's high-risk steps, best first.

    The failed responses are scanned for action verbs (an explained answer such as "I will open
    drawer 1. \\boxed{2}" names one); without verbs, the position of the high-risk steps decides:
    early failures point at finding the object, late ones at the task type or the target.
    """
    counts: dict[str, int] = {}
    for text in critic.failed_actions:
        for word in re.findall(r"[a-z]+", text.lower()):
            if word in EASIER_FOR_VERB:
                counts[word] = counts.get(word, 0) + 1
    rules = [rule for verb in sorted(counts, key=lambda v: (-counts[v], v)) for rule in EASIER_FOR_VERB[verb]]
    steps = [i for rollout in critic.high_risk_steps for i in rollout]
    if steps:
        early = sum(i < solution_length / 2 for i in steps) * 2 >= len(steps)
        rules += list(EASIER_WHEN_EARLY if early else EASIER_WHEN_LATE)
    return list(dict.fromkeys(rules))


class HouseholdEnv:
    """Rooms, receptacles and objects; pick-and-place and its harder cousins (implements Environment)."""

    domain = "household"
    judged_by = "verdicts"
    levels = len(LADDER)

    def __init__(
        self, max_steps: int = 40, expert: Literal["omniscient", "searching"] = "omniscient"
    ) -> None:
        self.max_steps = max_steps
        self.expert = expert  # what `expert_response` knows: the whole house, or what the agent has seen

    def _spec(self, params: dict[str, Any], difficulty: int, rng: random.Random, **extra: Any) -> TaskSpec:
        return TaskSpec(
            task_id=f"household-{rng.getrandbits(64):016x}",
            domain="household",
            difficulty=difficulty,
            params=params,
            seed=rng.getrandbits(31),
            signature=self.signature_of(params),
            **extra,
        )

    def sample_task(self, difficulty: int, rng: random.Random) -> TaskSpec:
        if not 0 <= difficulty < self.levels:
            raise ValueError(f"difficulty {difficulty} outside 0..{self.levels - 1}")
        params = sample_params(difficulty, rng, self.max_steps)
        if oracle_length(params) is None:  # a generator bug, never a property of the rng
            raise AssertionError(f"sampled an unsolvable household task at level {difficulty}")
        return self._spec(params, difficulty, rng)

    def reset(self, task: TaskSpec) -> HouseholdEpisode:
        return HouseholdEpisode(task)

    def oracle(self, task: TaskSpec, *, explain: bool = False) -> list[str]:
        """Shortest solution as responses, one per turn; `explain` prefixes each with a sentence."""
        episode = self.reset(task)
        path = episode.world.shortest_path(episode.state)
        if path is None:
            raise ValueError(f"task {task.task_id} is unsolvable")
        responses = []
        for op in path:
            actions = episode.world.actions(episode.state)
            text = next(t for t, o in actions if o == op)
            response = boxed(text)
            responses.append(f"I will {text}. {response}" if explain else response)
            episode.step(response)
        return responses

    def expert_response(self, episode: HouseholdEpisode) -> str | None:
        """The label for the episode's current state (None if done or stuck; demonstrations with
        detours): omniscient, the first step of a shortest solution; searching, the next step of an
        agent that knows only what this episode has seen (`World.searching_step`)."""
        if episode.done:
            return None
        if self.expert == "searching":
            step = episode.world.searching_step(episode.states)
        else:
            path = episode.world.shortest_path(episode.state)
            step = path[0] if path else None
        if step is None:
            return None
        return boxed(next(text for text, op in episode.world.actions(episode.state) if op == step))

    @staticmethod
    def signature_of(params: dict[str, Any]) -> str:
        blob = json.dumps(_canonical(params), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:24]  # bare hex: callers slice it for ids

    def signature(self, task: TaskSpec) -> str:
        return self.signature_of(task.params)

    def propose_variant(
        self, task: TaskSpec, direction: Direction, critic: CriticFeedback, rng: random.Random
    ) -> TaskSpec | None:
        """A pending variant whose oracle length moves in `direction` (or, failing that, one that only
        adds/removes distractors). Easier variants try first the rules that remove the complication
        named by the critic's failed actions (e.g. failed `open` -> open everything)."""
        base_len = oracle_length(task.params)
        if base_len is None:
            return None
        if direction == "harder":
            moves = harder_moves(task.params, rng)
            rng.shuffle(moves)
        else:
            moves = easier_moves(task.params, rng)
            rng.shuffle(moves)
            rank = {rule: i for i, rule in enumerate(preferred_easier_rules(critic, base_len))}
            moves.sort(key=lambda m: rank.get(m[0], len(rank)))
        sign = 1 if direction == "harder" else -1
        parent_signature = self.signature_of(task.params)
        fallback = None
        for rule, params in moves:
            if self.signature_of(params) == parent_signature:
                continue
            length = oracle_length(params)
            if length is None or not 1 <= length <= int(params.get("max_steps", 40)) // 2:
                continue
            if (length - base_len) * sign > 0:
                return self._variant(task, {**params, "origin": rule}, direction, rng)
            if fallback is None and length == base_len and rule.endswith("distractors"):
                fallback = (rule, params)
        if fallback is not None:
            return self._variant(task, {**fallback[1], "origin": fallback[0]}, direction, rng)
        return None

    def _variant(
        self, task: TaskSpec, params: dict[str, Any], direction: Direction, rng: random.Random
    ) -> TaskSpec:
        step = 1 if direction == "harder" else -1
        difficulty = min(max(task.difficulty + step, 0), self.levels - 1)
        return self._spec(
            params,
            difficulty,
            rng,
            status="pending",
            parent_id=task.task_id,
            direction=direction,
            generation=task.generation + 1,
        )

    def step_is_progress(self, task: TaskSpec, history: list[str], response: str) -> bool:
        return step_is_progress(task, history, response)

    def step_explores(self, task: TaskSpec, history: list[str], response: str) -> bool:
        return step_explores(task, history, response)


def step_is_progress(task: TaskSpec, history_responses: list[str], response: str) -> bool:
    """True iff `response`, played after `history_responses`, brings the oracle distance to the goal down."""
    episode = HouseholdEpisode(task)
    for past in history_responses:
        if episode.done:
            return False
        episode.step(past)
    if episode.done:
        return False
    before = episode.world.distance(episode.state)
    result = episode.step(response)
    if not result.valid_action:
        return False
    after = episode.world.distance(episode.state)
    return after is not None and (before is None or after < before)


def step_explores(task: TaskSpec, history_responses: list[str], response: str) -> bool:
    """True iff `response` looks where the agent has not looked while it has seen no goal object yet: a
    first visit to a room, or opening a closed receptacle. `step_is_progress` is a hindsight label (the
    oracle knows which closed receptacle holds the object), so it calls every such search step a
    detour; an agent that cannot see inside must make them."""
    episode = HouseholdEpisode(task)
    world = episode.world
    visited: set[int] = set()

    def look(state: State) -> bool:
        """Remember the room; True once a goal object is in view or in hand."""
        visited.add(state.loc)
        if state.held in world.goal_objs:
            return True
        return any(at >= 0 and world.rec_room[at] == state.loc and world.is_open(state, at)
                   for o, at in enumerate(state.obj_loc) if o in world.goal_objs)  # fmt: skip

    seen = look(episode.state)
    for past in history_responses:
        if episode.done:
            return False
        episode.step(past)
        seen = look(episode.state) or seen
    actions = world.actions(episode.state)
    index = parse_choice(response, [text for text, _ in actions])
    if seen or episode.done or index is None:
        return False
    op = actions[index][1]
    if op[0] == "go":
        return op[1] not in visited
    return op[0] == "open" and not world.is_open(episode.state, op[1])
