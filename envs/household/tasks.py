"""Household task generation: the difficulty ladder and the rule-based variant proposer.

Produces params dicts (plain JSON/msgpack data) that `world.World` compiles. Invariant: every
generated or proposed params dict is solvable (checked with the BFS oracle before it is returned).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Any

from envs.household.world import APPLIANCE_FOR, World, object_type

ROOMS = ("kitchen", "hallway", "livingroom", "bedroom", "bathroom", "office", "pantry", "garage")
OPEN_RECS = ("countertop", "table", "shelf", "desk", "sofa", "bed", "armchair", "sidetable", "garbagecan")
CLOSED_RECS = ("drawer", "cabinet", "safe", "dresser")
APPLIANCES = {
    "sink": ("sink", False),
    "microwave": ("microwave", True),
    "fridge": ("fridge", True),
    "lamp": ("desklamp", False),
}
OBJECTS = (
    "apple", "mug", "book", "plate", "cup", "knife", "potato", "egg", "pen", "key",
    "cellphone", "bowl", "tomato", "bread", "spoon", "vase", "pillow", "remote", "candle", "watch",
)  # fmt: skip


@dataclass(frozen=True)
class Rung:
    """One difficulty level of the ladder."""

    rooms: int
    receptacles: tuple[int, int]  # ordinary receptacles per room (min, max), appliances extra
    distractors: tuple[int, int]  # objects of other types
    openables: bool  # whether drawers/cabinets/... appear at all
    closed: float  # probability an openable receptacle starts closed
    hide: float  # probability the goal object starts inside a closed receptacle
    far: float  # probability the goal object starts in another room than the agent
    kinds: tuple[str, ...]  # task types


LADDER: tuple[Rung, ...] = (
    Rung(1, (2, 2), (0, 0), False, 0.0, 0.0, 0.0, ("place",)),  # 0: one room, object in sight
    Rung(1, (3, 3), (1, 2), False, 0.0, 0.0, 0.0, ("place",)),  # 1: + distractors
    Rung(1, (4, 5), (3, 4), False, 0.0, 0.0, 0.0, ("place",)),  # 2: more receptacles and distractors
    Rung(1, (3, 4), (2, 3), True, 0.3, 0.0, 0.0, ("place",)),  # 3: + containers, some closed
    Rung(1, (4, 4), (3, 4), True, 0.6, 1.0, 0.0, ("place",)),  # 4: object hidden in a closed one
    Rung(2, (3, 4), (3, 4), False, 0.0, 0.0, 1.0, ("place",)),  # 5: object in the next room, in sight
    Rung(2, (3, 3), (2, 3), True, 0.5, 0.3, 1.0, ("place",)),  # 6: two rooms, sometimes hidden
    Rung(2, (3, 3), (2, 3), True, 0.5, 0.4, 0.5, ("clean", "heat", "cool", "examine")),  # 7: transform
    Rung(2, (3, 4), (4, 5), True, 0.7, 0.7, 1.0, ("pick_two", "clean", "heat", "cool", "examine")),  # 8
    # 9: three rooms, mostly hidden; pick-two weighted double, no examine (the easiest kind)
    Rung(3, (3, 4), (4, 5), True, 0.8, 0.8, 1.0, ("pick_two", "pick_two", "clean", "heat", "cool")),
)


class _Namer:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, base: str) -> str:
        self.counts[base] = self.counts.get(base, 0) + 1
        return f"{base} {self.counts[base]}"


def _holders(params: dict[str, Any], room: str | None = None) -> list[dict[str, Any]]:
    return [
        r
        for r in params["receptacles"]
        if r.get("kind", "plain") != "lamp" and (room is None or r["room"] == room)
    ]


def sample_params(level: int, rng: random.Random, max_steps: int = 40) -> dict[str, Any]:
    rung = LADDER[level]
    rooms = rng.sample(ROOMS, rung.rooms)
    start = rooms[0] if rung.rooms == 1 else rng.choice(rooms)
    kind = rng.choice(rung.kinds)
    name = _Namer()
    recs: list[dict[str, Any]] = []
    for room in rooms:
        for _ in range(rng.randint(*rung.receptacles)):
            openable = rung.openables and rng.random() < 0.5
            base = rng.choice(CLOSED_RECS if openable else OPEN_RECS)
            recs.append(
                {"name": name(base), "room": room, "kind": "plain", "openable": openable,
                 "closed": openable and rng.random() < rung.closed}
            )  # fmt: skip
    if kind in APPLIANCE_FOR:
        akind = APPLIANCE_FOR[kind]
        base, openable = APPLIANCES[akind]
        recs.append(
            {"name": name(base), "room": rng.choice(rooms), "kind": akind, "openable": openable,
             "closed": openable and rng.random() < rung.closed}
        )  # fmt: skip
    goal_type = rng.choice(OBJECTS)
    params: dict[str, Any] = {
        "rooms": rooms,
        "doors": [[a, b] for a, b in zip(rooms, rooms[1:], strict=False)],
        "start": start,
        "receptacles": recs,
        "objects": [],
        "max_steps": max_steps,
    }
    # Goal object(s): near or far, visible or hidden; the target is a different holder.
    n_goal = 2 if kind == "pick_two" else 1
    far = rung.rooms > 1 and rng.random() < rung.far
    obj_rooms = [r for r in rooms if r != start] if far else [start]
    hide = rung.openables and rng.random() < rung.hide
    spots = [r for r in _holders(params) if r["room"] in obj_rooms]
    if hide:
        spots = [r for r in spots if r["openable"]] or spots
    goal_spots = [rng.choice(spots) for _ in range(n_goal)]
    for spot in goal_spots:
        if hide and spot["openable"]:
            spot["closed"] = True
        params["objects"].append({"name": name(goal_type), "at": spot["name"]})
    if kind == "examine":
        target = next(r for r in recs if r["kind"] == "lamp")
    else:
        taken = {s["name"] for s in goal_spots}
        choices = [r for r in _holders(params) if r["name"] not in taken]
        if rung.rooms == 1 or rng.random() < 0.5:
            choices = [r for r in choices if r["room"] == start] or choices
        target = rng.choice(choices)
    params["goal"] = {"kind": kind, "object": goal_type, "target": target["name"]}
    others = [o for o in OBJECTS if o != goal_type]
    for _ in range(rng.randint(*rung.distractors)):
        params["objects"].append(
            {"name": name(rng.choice(others)), "at": rng.choice(_holders(params))["name"]}
        )
    return params


# --- variants (the paper's rule-based env model: harder / easier, OBJ and REC substitution) ---


def _new_room(params: dict[str, Any], rng: random.Random) -> str | None:
    free = [r for r in ROOMS if r not in params["rooms"]]
    return rng.choice(free) if free else None


def _name(params: dict[str, Any], base: str) -> str:
    used = {r["name"] for r in params["receptacles"]} | {o["name"] for o in params["objects"]}
    i = 1
    while f"{base} {i}" in used:
        i += 1
    return f"{base} {i}"


def _goal_objects(params: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for o in params["objects"] if object_type(o["name"]) == params["goal"]["object"]]


def _rec(params: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in params["receptacles"] if r["name"] == name)


def obj_substitutions(p: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """OBJ substitution: make a distractor the goal object (the old goal objects become distractors).

    Only types with exactly as many instances as the task needs, none already in the target; the
    caller keeps the ones whose oracle length moves in the wanted direction.
    """
    goal = p["goal"]
    need = 2 if goal["kind"] == "pick_two" else 1
    counts: dict[str, list[dict[str, Any]]] = {}
    for o in p["objects"]:
        counts.setdefault(object_type(o["name"]), []).append(o)
    out = []
    for kind, objs in sorted(counts.items()):
        if kind == goal["object"] or len(objs) != need or any(o["at"] == goal["target"] for o in objs):
            continue
        q = copy.deepcopy(p)
        q["goal"]["object"] = kind
        out.append(("obj_substitution", q))
    return out


def harder_moves(p: dict[str, Any], rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """Candidate harder variants of params `p`, each tagged with the rule that made it."""
    out: list[tuple[str, dict[str, Any]]] = []
    goal = p["goal"]
    # add a room beyond the last one and move the goal object(s) there, hidden in a closed drawer
    room = _new_room(p, rng)
    if room is not None and len(p["rooms"]) < 4:
        q = copy.deepcopy(p)
        q["doors"].append([q["rooms"][-1], room])
        q["rooms"].append(room)
        name = _name(q, rng.choice(CLOSED_RECS))
        q["receptacles"].append(
            {"name": name, "room": room, "kind": "plain", "openable": True, "closed": True}
        )
        q["receptacles"].append({"name": _name(q, rng.choice(OPEN_RECS)), "room": room, "kind": "plain"})
        for o in _goal_objects(q):
            o["at"] = name
        out.append(("add_room", q))
    # hide the goal object in a closed receptacle of its room (add one if there is none)
    q = copy.deepcopy(p)
    obj = _goal_objects(q)[0]
    here = _rec(q, obj["at"])
    if not (here.get("openable") and here.get("closed")):
        holders = [r for r in _holders(q, here["room"]) if r.get("openable") and r["name"] != goal["target"]]
        if holders:
            spot = rng.choice(holders)
        else:
            spot = {"name": _name(q, rng.choice(CLOSED_RECS)), "room": here["room"], "kind": "plain",
                    "openable": True}  # fmt: skip
            q["receptacles"].append(spot)
        spot["closed"] = True
        obj["at"] = spot["name"]
        out.append(("hide_object", q))
    # close the target
    target = _rec(p, goal["target"])
    if target.get("openable") and not target.get("closed"):
        q = copy.deepcopy(p)
        _rec(q, goal["target"])["closed"] = True
        out.append(("close_target", q))
    # REC substitution: move the goal to a receptacle in another room than the object
    if goal["kind"] != "examine":
        obj_room = _rec(p, _goal_objects(p)[0]["at"])["room"]
        far = [r for r in _holders(p) if r["room"] != obj_room and r["name"] != goal["target"]]
        if far:
            q = copy.deepcopy(p)
            q["goal"]["target"] = rng.choice(far)["name"]
            out.append(("rec_substitution", q))
    # change the task type: place -> transform / pick two
    if goal["kind"] == "place":
        q = copy.deepcopy(p)
        kind = rng.choice(("clean", "heat", "cool", "pick_two"))
        q["goal"]["kind"] = kind
        if kind == "pick_two":
            q["objects"].append({"name": _name(q, goal["object"]), "at": _goal_objects(q)[0]["at"]})
        else:
            akind = APPLIANCE_FOR[kind]
            if not any(r.get("kind") == akind for r in q["receptacles"]):
                base, openable = APPLIANCES[akind]
                q["receptacles"].append({"name": _name(q, base), "room": rng.choice(q["rooms"]),
                                         "kind": akind, "openable": openable})  # fmt: skip
        out.append(("task_type", q))
    out.extend(obj_substitutions(p))
    # distractors
    q = copy.deepcopy(p)
    others = [o for o in OBJECTS if o != goal["object"]]
    for _ in range(2):
        q["objects"].append({"name": _name(q, rng.choice(others)), "at": rng.choice(_holders(q))["name"]})
    out.append(("add_distractors", q))
    return out


def easier_moves(p: dict[str, Any], rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """Candidate easier variants of params `p`, each tagged with the rule that made it."""
    out: list[tuple[str, dict[str, Any]]] = []
    goal = p["goal"]
    # bring everything into the start room (one room)
    if len(p["rooms"]) > 1:
        q = copy.deepcopy(p)
        q["rooms"] = [q["start"]]
        q["doors"] = []
        for r in q["receptacles"]:
            r["room"] = q["start"]
        out.append(("merge_rooms", q))
    # OBJ move: put the goal object(s) in sight, on the target's room's open holder
    q = copy.deepcopy(p)
    start_open = [r for r in _holders(q, q["start"]) if not r.get("closed") and r["name"] != goal["target"]]
    if start_open:
        spot = rng.choice(start_open)
        moved = False
        for o in _goal_objects(q):
            if o["at"] != spot["name"]:
                o["at"], moved = spot["name"], True
        if moved:
            out.append(("object_in_sight", q))
    # open every closed receptacle
    if any(r.get("closed") for r in p["receptacles"]):
        q = copy.deepcopy(p)
        for r in q["receptacles"]:
            r["closed"] = False
        out.append(("open_all", q))
    # REC substitution: a target in the object's room
    if goal["kind"] != "examine":
        obj_room = _rec(p, _goal_objects(p)[0]["at"])["room"]
        target_room = _rec(p, goal["target"])["room"]
        near = [
            r for r in _holders(p, obj_room)
            if r["name"] != goal["target"] and r["name"] not in {o["at"] for o in _goal_objects(p)}
        ]  # fmt: skip
        if near and target_room != obj_room:
            q = copy.deepcopy(p)
            q["goal"]["target"] = rng.choice(near)["name"]
            out.append(("rec_substitution", q))
    out.extend(obj_substitutions(p))
    # simpler task type
    if goal["kind"] in ("pick_two", "clean", "heat", "cool"):
        q = copy.deepcopy(p)
        q["goal"]["kind"] = "place"
        out.append(("task_type", q))
    # fewer distractors
    distractors = [o for o in p["objects"] if object_type(o["name"]) != goal["object"]]
    if distractors:
        q = copy.deepcopy(p)
        drop = {o["name"] for o in rng.sample(distractors, min(2, len(distractors)))}
        q["objects"] = [o for o in q["objects"] if o["name"] not in drop]
        out.append(("remove_distractors", q))
    return out


# which easier rule removes the complication a failed action points at
EASIER_FOR_VERB = {
    "go": ("merge_rooms", "object_in_sight"),
    "open": ("open_all", "object_in_sight"),
    "close": ("open_all",),
    "take": ("remove_distractors", "object_in_sight"),
    "put": ("rec_substitution", "remove_distractors"),
    "clean": ("task_type",),
    "heat": ("task_type",),
    "cool": ("task_type",),
    "use": ("task_type", "remove_distractors"),
}
EASIER_WHEN_EARLY = ("object_in_sight", "merge_rooms", "open_all")  # failed while finding the object
EASIER_WHEN_LATE = ("task_type", "rec_substitution", "remove_distractors")  # failed after finding it


def oracle_length(params: dict[str, Any]) -> int | None:
    world = World(params)
    return world.distance(world.initial)
