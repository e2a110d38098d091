"""Microsoft TextWorld's games (the engine AlfWorld is built on) behind `envs.base.Environment`:
TextWorldEnv plays its cooking games (domain `textworld`), TextWorldCustomEnv its `custom` games
(domain `textworld-custom`: rooms, objects and a quest of a given length), each on a ladder of its own.

A task is data: `params` holds the game's kind, the engine's knobs (cooking: recipe size, ingredients to
take, rooms, open / cook / cut / drop; custom: world size, objects, quest length) and the game seed; any
process rebuilds the same game from them (envs/textworld/games.py generates it once). Each turn the
policy sees the objective, where it is, what it carries, what the game said to its last command, and
the admissible commands numbered in sorted order (without the engine's look / inventory / examine
verbs, which only repeat what the prompt shows; the cookbook stays); it answers `\\boxed{command}`
(or its number) as in household, so the same presets serve. Outcome +1 iff the game is won within
`max_steps` turns; lost or out of turns is -1.

The recipe is only in the cookbook: once read, every later prompt carries it (`Recipe: ...`), as a player
remembers it; before, the ingredients can only be guessed. The expert (of bootstrap SFT and DAgger, and
the oracle) reads the cookbook as soon as it is listed, then follows the engine's own walkthrough from
the current state (`policy_commands`), which knows the recipe and never reads it. A step is progress
when it wins, shortens the walkthrough, or reads the recipe for the first time.
"""

from __future__ import annotations

import random
import re
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from envs.base import ANSWER_INSTRUCTION, Direction, StepResult, boxed, listed_prefix, parse_choice
from envs.textworld.games import (
    COOKING_KNOBS,
    CUSTOM_KNOBS,
    GameGenerationError,
    game_file,
    game_key,
    generate_games,
)
from schemas.events import CriticFeedback, TaskSpec

INSTRUCTION = ANSWER_INSTRUCTION
INVALID = "Invalid answer: reply with \\boxed{action} naming a listed command."
JUDGE_HISTORY = 8
MAX_STEPS = 40
GO_STEPS = (1, 6, 9, 12)  # the engine's room counts
COOKBOOK = "examine cookbook"

# The difficulty ladder: each rung is the one before with one or two knobs tightened (README: random-valid
# and bootstrap success per rung).
LADDER: tuple[dict[str, Any], ...] = tuple(
    {"recipe": r, "take": t, "go": g, "open": o, "cook": c, "cut": x, "drop": d}
    for r, t, g, o, c, x, d in (
        (1, 1, 1, False, False, False, False),
        (1, 1, 1, True, False, False, False),
        (1, 1, 6, True, False, False, False),
        (2, 2, 6, True, False, False, False),
        (2, 2, 6, True, False, True, False),
        (2, 2, 6, True, True, True, False),
        (3, 3, 6, True, True, True, False),
        (3, 3, 9, True, True, True, False),
        (3, 3, 12, True, True, True, False),
    )
)
# Not on the ladder, and never moved by a variant: `drop` (a limited inventory). The engine gives such
# games no walkthrough (`policy_commands` is empty from the start), so they have no oracle or labels.

# The custom games' ladder: (rooms, objects, quest length), no knob easier than on the rung below, ordered
# by the measured success of a random valid policy (README; the objective spells out the quest, so a
# random policy wins the one-step quests of rung 0 every time and the 6-step ones of rung 8 rarely).
CUSTOM_LADDER: tuple[dict[str, Any], ...] = tuple(
    {"world_size": w, "nb_objects": n, "quest_length": q}
    for w, n, q in (
        (1, 2, 1),
        (2, 4, 1),
        (2, 4, 2),
        (3, 6, 2),
        (3, 6, 3),
        (4, 8, 3),
        (4, 8, 4),
        (6, 10, 5),
        (6, 12, 6),
    )
)
CUSTOM_LIMITS = {"world_size": (1, 12), "nb_objects": (1, 30), "quest_length": (1, 12)}

# Verbs in the critic's failed actions -> the knob that makes that part of the game harder.
KNOB_FOR_VERB = {
    "open": "open", "close": "open", "unlock": "open",
    "cook": "cook", "roast": "cook", "fry": "cook", "grill": "cook", "bake": "cook",
    "chop": "cut", "slice": "cut", "dice": "cut",
    "go": "go", "take": "take", "drop": "drop",
}  # fmt: skip
# Custom games: a wrong way is the map's fault, a wrong object the distractors', the rest the quest's.
CUSTOM_KNOB_FOR_VERB = {
    "go": "world_size",
    "take": "nb_objects", "drop": "nb_objects", "eat": "nb_objects", "examine": "nb_objects",
    "open": "quest_length", "close": "quest_length", "unlock": "quest_length", "lock": "quest_length",
    "put": "quest_length", "insert": "quest_length",
}  # fmt: skip


def clean(text: str) -> str:
    """The game's words without its prompt line, status bar or end-of-game banner."""
    text = re.split(r"\n\s*>", "\n" + text, maxsplit=1)[0]
    return text.split("*** The End ***", 1)[0].strip()


def shown_commands(admissible: list[str]) -> list[str]:
    keep = [c for c in admissible if not c.startswith(("look", "inventory", "examine ")) or c == COOKBOOK]
    return sorted(set(keep))


def made_progress(before: View, after: View) -> bool:
    """A valid step from `before` to `after` is progress iff it wins, shortens the walkthrough or reads
    the recipe for the first time."""
    return (
        after.won
        or len(after.walkthrough) < len(before.walkthrough)
        or bool(after.recipe and not before.recipe)
    )


def recipe_of(text: str) -> str:
    """The cookbook's recipe in one line (`ingredients a, b; directions slice a, prepare meal`), or ""
    when `text` is not the cookbook's page."""
    found = re.search(r"Ingredients:(.*?)Directions:(.*)", text, re.S)
    if found is None:
        return ""
    ingredients, directions = (
        [line.strip() for line in part.splitlines() if line.strip()] for part in found.groups()
    )
    return f"ingredients {', '.join(ingredients)}; directions {', '.join(directions)}"


def knobs_of(params: dict[str, Any]) -> dict[str, Any]:
    """The engine's knobs of a task's game (what names the game, with its seed)."""
    return {k: params[k] for k in (CUSTOM_KNOBS if params.get("kind") == "custom" else COOKING_KNOBS)}


@dataclass(frozen=True)
class View:
    """What one state of the game shows, and how far the walkthrough from it still is."""

    description: str
    inventory: str
    commands: list[str]
    walkthrough: list[str]
    won: bool
    lost: bool
    recipe: str = ""  # the cookbook's recipe once the episode has read it

    @classmethod
    def of(cls, state: Any, recipe: str = "") -> View:
        return cls(clean(state.description or ""), clean(state.inventory or ""),
                   shown_commands(list(state.admissible_commands or [])),
                   list(state.policy_commands or []), bool(state.won), bool(state.lost), recipe)  # fmt: skip

    def render(self) -> str:
        recipe = f"\nRecipe: {self.recipe}." if self.recipe else ""
        return f"{self.description}\n{self.inventory}{recipe}"

    def numbered(self) -> str:
        return "\n".join(f"{i}: {c}" for i, c in enumerate(self.commands))


class TextWorldEpisode:
    """One play-through of a TextWorld game (implements `envs.base.Episode`)."""

    def __init__(self, task: TaskSpec) -> None:
        import textworld

        self.task = task
        self.max_steps = int(task.params.get("max_steps", MAX_STEPS))
        infos = textworld.EnvInfos(admissible_commands=True, objective=True, policy_commands=True,
                                   won=True, lost=True, inventory=True, description=True)  # fmt: skip
        path = game_file(knobs_of(task.params), task.seed)
        with warnings.catch_warnings():  # jericho: "not fully supported" = no score display; we read won/lost
            warnings.simplefilter("ignore")
            self._game = textworld.start(str(path), request_infos=infos)
        state = self._game.reset()
        self.objective = clean(state.objective or "")
        self.views: list[View] = [View.of(state)]  # the view before each turn (and after the last)
        self.actions_taken: list[str | None] = []  # command per turn, None for an invalid answer
        self.feedback: list[str] = []

    @property
    def view(self) -> View:
        return self.views[-1]

    def admissible(self) -> list[str]:
        """The commands listed in the prompt, in index order."""
        return self.view.commands

    def prompt(self) -> str:
        recent = [a if a is not None else "invalid" for a in self.actions_taken[-2:]]
        lines = [f"Task: {self.objective}", self.view.render()]
        if self.feedback:
            lines.append(f"Game: {self.feedback[-1]}")
        lines.append(f"Last actions: {'; '.join(recent) if recent else 'none'}.")
        lines += ["Actions:", self.view.numbered(), INSTRUCTION]
        return "\n".join(lines)

    def step(self, response: str) -> StepResult:
        if self.done:
            raise RuntimeError("step() on a finished episode")
        commands = self.view.commands
        index = parse_choice(response, commands)
        if index is None:
            self.actions_taken.append(None)
            self.feedback.append(INVALID)
            self.views.append(self.view)
            return StepResult(f"{INVALID}\n{self.view.render()}", self.done, valid_action=False,
                              info={"action": None, "listed_prefix": listed_prefix(response, commands)})  # fmt: skip
        command = commands[index]
        state, _, _ = self._game.step(command)
        said = clean(state.feedback or "")
        view = View.of(state, self.view.recipe or recipe_of(said))
        if view.won:
            said += " Task done."
        self.actions_taken.append(command)
        self.feedback.append(said)
        self.views.append(view)
        if self.done:
            self._game.close()
        return StepResult(
            f"{said}\n{view.render()}", self.done, info={"action": command, "achieved": view.won}
        )

    def last_step_progress(self) -> bool:
        """The step label of the turn just played, read off the two walkthroughs it kept (what
        `TextWorldEnv.step_is_progress` computes by replaying the history, without the replay: a
        game start and a step per past turn, which made a bootstrap's labels cost minutes)."""
        if not self.actions_taken:
            raise RuntimeError("last_step_progress() before any step")
        return self.actions_taken[-1] is not None and made_progress(self.views[-2], self.views[-1])

    @property
    def done(self) -> bool:
        return self.view.won or self.view.lost or len(self.actions_taken) >= self.max_steps

    @property
    def outcome(self) -> Literal[1, -1]:
        return 1 if self.view.won else -1

    def judge_context(self, step_index: int) -> str:
        step_index = min(step_index, len(self.views) - 1)
        done = [a if a is not None else "invalid" for a in self.actions_taken[:step_index]]
        first = max(0, len(done) - JUDGE_HISTORY)
        history = "; ".join(f"{i + 1}. {a}" for i, a in enumerate(done) if i >= first) or "none"
        view = self.views[step_index]
        return (f"Task: {self.objective}\nPrevious actions: {history}.\n{view.render()}\n"
                f"Actions:\n{view.numbered()}")  # fmt: skip


class TextWorldEnv:
    """TextWorld cooking games on a ladder of the engine's knobs (implements Environment)."""

    domain = "textworld"
    kind = "cooking"
    ladder = LADDER
    knob_for_verb = KNOB_FOR_VERB
    judged_by = "verdicts"
    levels = len(LADDER)
    # Bootstrap SFT (presets) draws its tasks from a fixed pool: a new game is 5-20 s of `tw-make`, and
    # the policy preset alone plays ~3,000 episodes. 16 games on each of the first 5 rungs (walkthroughs
    # of 3-9 steps) is 80 games, generated once into the cache (held-out games come from other seeds).
    bootstrap_levels = range(5)
    bootstrap_games = 16
    # Games per rung each DAgger round of the policy preset draws from, its played states and its mixed-in
    # demonstrations alike; one round each. The first round corrects the SFT on its own pool, which the
    # policy then knows by heart (16 of 16 won, no invalid turn; 0 of 16 outside it, 4 of 5 turns
    # invalid). A second round on the same 16 games: held-out rungs 0-2, 13 of 60 won against 18; on 64
    # games, 48 of them new: 39 of 60, invalid turns 0.79 -> 0.34 at rung 2.
    dagger_games = (16, 64)

    def __init__(self, max_steps: int = MAX_STEPS) -> None:
        self.max_steps = max_steps

    def _spec(self, knobs: dict[str, Any], difficulty: int, rng: random.Random, origin: str | None = None,
              **extra: Any) -> TaskSpec:  # fmt: skip
        seed = rng.getrandbits(31)
        params = {"kind": self.kind, **knobs, "max_steps": self.max_steps}
        knobs = knobs_of(params)
        if origin is not None:
            params["origin"] = origin  # the knob a variant moved
        return TaskSpec(task_id=f"{self.domain}-{rng.getrandbits(64):016x}", domain=self.domain,
                        difficulty=difficulty, params=params, seed=seed,
                        signature=game_key(knobs, seed), **extra)  # fmt: skip

    def sample_task(self, difficulty: int, rng: random.Random) -> TaskSpec:
        if not 0 <= difficulty < self.levels:
            raise ValueError(f"difficulty {difficulty} outside 0..{self.levels - 1}")
        return self._spec(dict(self.ladder[difficulty]), difficulty, rng)

    def reset(self, task: TaskSpec) -> TextWorldEpisode:
        return TextWorldEpisode(task)

    def prefetch(self, tasks: list[TaskSpec]) -> None:
        """Build the games of `tasks` now, one per core (those already in the cache cost nothing), so
        that the resets of a batch played side by side do not generate them one at a time."""
        generate_games([(knobs_of(t.params), t.seed) for t in tasks])

    def oracle(self, task: TaskSpec) -> list[str]:
        """The engine's walkthrough as `\\boxed{command}` answers, one per turn; ValueError when the game
        cannot be built or won (the env model then refuses the candidate)."""
        try:
            episode = self.reset(task)
        except GameGenerationError as e:
            raise ValueError(f"task {task.task_id}: {e}") from e
        answers = []
        while not episode.done:
            answer = self.expert_response(episode)
            if answer is None:
                raise ValueError(f"task {task.task_id}: the walkthrough leaves the listed commands")
            answers.append(answer)
            episode.step(answer)
        if episode.outcome != 1:
            raise ValueError(
                f"task {task.task_id}: the walkthrough does not win within {episode.max_steps} turns"
            )
        return answers

    def expert_response(self, episode: TextWorldEpisode) -> str | None:
        """Reading the cookbook where it is listed and unread, else the walkthrough's next command from
        the current state, as an answer (None if done or it is not among the listed commands)."""
        view = episode.view
        if episode.done or not view.walkthrough:
            return None
        if not view.recipe and COOKBOOK in view.commands:
            return boxed(COOKBOOK)
        return boxed(view.walkthrough[0]) if view.walkthrough[0] in view.commands else None

    def signature(self, task: TaskSpec) -> str:
        return game_key(knobs_of(task.params), task.seed)

    def step_is_progress(self, task: TaskSpec, history: list[str], response: str) -> bool:
        """True iff `response` after `history` wins, or shortens the walkthrough to a win."""
        episode = self.reset(task)
        for past in history:
            if episode.done:
                return False
            episode.step(past)
        if episode.done:
            return False
        episode.step(response)
        return episode.last_step_progress()

    def propose_variant(
        self, task: TaskSpec, direction: Direction, critic: CriticFeedback, rng: random.Random
    ) -> TaskSpec | None:
        """The same kind of game with one knob moved one notch in `direction` (a new seed). Easier
        variants first relax the knob behind the critic's failed actions (a failed `open` -> no
        closed containers); harder ones tighten a random knob."""
        knobs = knobs_of(task.params)
        moves = self._moves(knobs, direction)
        if not moves:
            return None
        rng.shuffle(moves)
        if direction == "easier":
            named = [self.knob_for_verb[w] for text in critic.failed_actions
                     for w in re.findall(r"[a-z]+", text.lower()) if w in self.knob_for_verb]  # fmt: skip
            moves.sort(key=lambda m: named.index(m[0]) if m[0] in named else len(named))
        knob, moved = moves[0]
        step = 1 if direction == "harder" else -1
        return self._spec(moved, min(max(task.difficulty + step, 0), self.levels - 1), rng, origin=knob,
                          status="pending", parent_id=task.task_id, direction=direction,
                          generation=task.generation + 1)  # fmt: skip

    @staticmethod
    def _moves(knobs: dict[str, Any], direction: Direction) -> list[tuple[str, dict[str, Any]]]:
        return _cooking_moves(knobs, direction)


class TextWorldCustomEnv(TextWorldEnv):
    """TextWorld `custom` games (rooms, objects, a quest of a given length, the objective spelling out
    its steps) on a ladder of their own (implements Environment)."""

    domain = "textworld-custom"
    kind = "custom"
    ladder = CUSTOM_LADDER
    knob_for_verb = CUSTOM_KNOB_FOR_VERB
    levels = len(CUSTOM_LADDER)

    @staticmethod
    def _moves(knobs: dict[str, Any], direction: Direction) -> list[tuple[str, dict[str, Any]]]:
        """One more / one fewer room or quest step, two more / fewer objects, within CUSTOM_LIMITS."""
        out = []
        for knob, notch in (("world_size", 1), ("nb_objects", 2), ("quest_length", 1)):
            low, high = CUSTOM_LIMITS[knob]
            value = knobs[knob] + (notch if direction == "harder" else -notch)
            if low <= value <= high:
                out.append((knob, {**knobs, knob: value}))
        return out


def _cooking_moves(knobs: dict[str, Any], direction: Direction) -> list[tuple[str, dict[str, Any]]]:
    """(knob, knobs with that knob one notch harder / easier), for every knob that can move."""
    out = []
    up = direction == "harder"
    for knob in ("open", "cook", "cut"):
        if knobs[knob] != up:
            out.append((knob, {**knobs, knob: up}))
    if up and knobs["recipe"] < 3:
        out.append(("recipe", {**knobs, "recipe": knobs["recipe"] + 1}))
    if not up and knobs["recipe"] > max(1, knobs["take"]):
        out.append(("recipe", {**knobs, "recipe": knobs["recipe"] - 1}))
    if up and knobs["take"] < knobs["recipe"]:
        out.append(("take", {**knobs, "take": knobs["take"] + 1}))
    if not up and knobs["take"] > 1:  # the engine needs at least one ingredient to take
        out.append(("take", {**knobs, "take": knobs["take"] - 1}))
    i = GO_STEPS.index(knobs["go"])
    if 0 <= i + (1 if up else -1) < len(GO_STEPS):
        out.append(("go", {**knobs, "go": GO_STEPS[i + (1 if up else -1)]}))
    return out
