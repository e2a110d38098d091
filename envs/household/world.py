"""The household world: a pure state machine compiled from a task's params, plus a BFS oracle.

A world is rooms joined by doors, receptacles in rooms (some openable, some appliances: sink,
microwave, fridge, desklamp) and objects in receptacles. The agent stands in a room, sees every
receptacle there (a closed one hides its contents) and holds at most one object.

Invariant: `World(params)` is a pure function of the params dict, `State` is an immutable tuple,
and `World.actions(state)` lists the admissible actions sorted by their text, so the numbering the
policy sees is stable for a given state.
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

GOAL_KINDS = ("place", "pick_two", "clean", "heat", "cool", "examine")
# task kind -> the appliance kind it needs
APPLIANCE_FOR = {"clean": "sink", "heat": "microwave", "cool": "fridge", "examine": "lamp"}
# appliance kind -> (verb, object flag it sets, flag it clears)
TRANSFORMS = {"sink": ("clean", 1, 0), "microwave": ("heat", 2, 4), "fridge": ("cool", 4, 2)}
FLAG_FOR_GOAL = {"clean": 1, "heat": 2, "cool": 4}
FLAG_WORDS = ((1, "clean"), (2, "hot"), (4, "cool"))
RECEPTACLE_KINDS = ("plain", "sink", "microwave", "fridge", "lamp")


class State(NamedTuple):
    loc: int  # room index
    held: int  # object index, -1 for empty hands
    opened: int  # bitmask over receptacles: bit r set = receptacle r is open (non-openables ignore it)
    obj_loc: tuple[int, ...]  # receptacle index per object, -1 while held
    flags: tuple[int, ...]  # per object: 1 clean, 2 hot, 4 cool
    examined: bool  # the goal object was looked at under a lamp


# An operation: ("go", room) | ("open", r) | ("close", r) | ("take", o, r) | ("put", o, r)
# | ("transform", o, r) | ("use", r)
Op = tuple[Any, ...]


def object_type(name: str) -> str:
    """'apple 2' -> 'apple'."""
    return name.rsplit(" ", 1)[0]


def describe_object(name: str, flags: int) -> str:
    words = [w for bit, w in FLAG_WORDS if flags & bit]
    return f"{name} ({', '.join(words)})" if words else name


class World:
    """Static structure of one task, with transitions over `State`s."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.rooms: list[str] = list(params["rooms"])
        room_index = {r: i for i, r in enumerate(self.rooms)}
        neighbours: list[set[int]] = [set() for _ in self.rooms]
        for a, b in params.get("doors", []):
            neighbours[room_index[a]].add(room_index[b])
            neighbours[room_index[b]].add(room_index[a])
        self.exits = [sorted(n, key=lambda i: self.rooms[i]) for n in neighbours]
        recs = params["receptacles"]
        self.rec_names: list[str] = [r["name"] for r in recs]
        rec_index = {n: i for i, n in enumerate(self.rec_names)}
        if len(rec_index) != len(recs):
            raise ValueError("receptacle names must be unique")
        self.rec_room = [room_index[r["room"]] for r in recs]
        self.rec_kind: list[str] = [r.get("kind", "plain") for r in recs]
        self.rec_openable = [bool(r.get("openable", False)) for r in recs]
        for kind in self.rec_kind:
            if kind not in RECEPTACLE_KINDS:
                raise ValueError(f"unknown receptacle kind {kind!r}")
        self.room_recs = [
            sorted((i for i, rm in enumerate(self.rec_room) if rm == room), key=lambda i: self.rec_names[i])
            for room in range(len(self.rooms))
        ]
        objs = params["objects"]
        self.obj_names: list[str] = [o["name"] for o in objs]
        self.obj_types = [object_type(n) for n in self.obj_names]
        goal = params["goal"]
        self.goal_kind: str = goal["kind"]
        if self.goal_kind not in GOAL_KINDS:
            raise ValueError(f"unknown goal kind {self.goal_kind!r}")
        self.goal_type: str = goal["object"]
        self.target = rec_index[goal["target"]]
        self.goal_objs = frozenset(i for i, t in enumerate(self.obj_types) if t == self.goal_type)
        self.max_steps = int(params.get("max_steps", 40))
        opened = 0
        for i, r in enumerate(recs):
            if not r.get("openable", False) or not r.get("closed", False):
                opened |= 1 << i
        self.initial = State(
            loc=room_index[params["start"]],
            held=-1,
            opened=opened,
            obj_loc=tuple(rec_index[o["at"]] for o in objs),
            flags=tuple(int(o.get("flags", 0)) for o in objs),
            examined=False,
        )
        for o in objs:
            if self.rec_kind[rec_index[o["at"]]] == "lamp":
                raise ValueError(f"{o['name']} cannot be in a lamp")

    # --- queries ---
    def is_open(self, s: State, r: int) -> bool:
        return bool(s.opened >> r & 1)

    def contents(self, s: State, r: int) -> list[int]:
        return sorted((o for o, at in enumerate(s.obj_loc) if at == r), key=lambda o: self.obj_names[o])

    def achieved(self, s: State) -> bool:
        kind = self.goal_kind
        if kind == "examine":
            return s.examined
        in_target = [o for o in self.goal_objs if s.obj_loc[o] == self.target]
        if kind == "place":
            return len(in_target) >= 1
        if kind == "pick_two":
            return len(in_target) >= 2
        flag = FLAG_FOR_GOAL[kind]
        return any(s.flags[o] & flag for o in in_target)

    def goal_text(self) -> str:
        t, tgt = self.goal_type, self.rec_names[self.target]
        return {
            "place": f"put a {t} in {tgt}.",
            "pick_two": f"put two {t} in {tgt}.",
            "clean": f"put a clean {t} in {tgt}.",
            "heat": f"put a hot {t} in {tgt}.",
            "cool": f"put a cool {t} in {tgt}.",
            "examine": f"examine a {t} under {tgt}.",
        }[self.goal_kind]

    def action_text(self, op: Op) -> str:
        verb = op[0]
        if verb == "go":
            return f"go to {self.rooms[op[1]]}"
        if verb in ("open", "close", "use"):
            return f"{verb} {self.rec_names[op[1]]}"
        if verb == "take":
            return f"take {self.obj_names[op[1]]} from {self.rec_names[op[2]]}"
        if verb == "put":
            return f"put {self.obj_names[op[1]]} in {self.rec_names[op[2]]}"
        word = TRANSFORMS[self.rec_kind[op[2]]][0]
        return f"{word} {self.obj_names[op[1]]} with {self.rec_names[op[2]]}"

    # --- transitions ---
    def ops(self, s: State) -> list[Op]:
        """Every admissible operation in `s` (unsorted)."""
        out: list[Op] = [("go", n) for n in self.exits[s.loc]]
        for r in self.room_recs[s.loc]:
            kind = self.rec_kind[r]
            accessible = not self.rec_openable[r] or self.is_open(s, r)
            if self.rec_openable[r]:
                out.append(("close", r) if self.is_open(s, r) else ("open", r))
            if kind == "lamp":
                out.append(("use", r))
                continue
            if s.held < 0:
                if accessible:
                    out.extend(("take", o, r) for o, at in enumerate(s.obj_loc) if at == r)
            else:
                if accessible:
                    out.append(("put", s.held, r))
                if kind in TRANSFORMS:
                    out.append(("transform", s.held, r))
        return out

    def actions(self, s: State) -> list[tuple[str, Op]]:
        """Admissible actions as (text, op), sorted by text: the numbering the policy sees."""
        return sorted((self.action_text(op), op) for op in self.ops(s))

    def apply(self, s: State, op: Op) -> tuple[State, str]:
        """Next state and a one-line feedback. `op` must be admissible in `s`."""
        verb = op[0]
        if verb == "go":
            return s._replace(loc=op[1]), f"You go to the {self.rooms[op[1]]}."
        if verb == "open":
            s2 = s._replace(opened=s.opened | 1 << op[1])
            inside = self.contents(s2, op[1])
            seen = ", ".join(describe_object(self.obj_names[o], s.flags[o]) for o in inside) or "nothing"
            return s2, f"You open {self.rec_names[op[1]]}. Inside: {seen}."
        if verb == "close":
            return s._replace(opened=s.opened & ~(1 << op[1])), f"You close {self.rec_names[op[1]]}."
        if verb == "take":
            o, r = op[1], op[2]
            loc = list(s.obj_loc)
            loc[o] = -1
            s2 = s._replace(held=o, obj_loc=tuple(loc))
            return s2, f"You take {self.obj_names[o]} from {self.rec_names[r]}."
        if verb == "put":
            o, r = op[1], op[2]
            loc = list(s.obj_loc)
            loc[o] = r
            s2 = s._replace(held=-1, obj_loc=tuple(loc))
            return s2, f"You put {self.obj_names[o]} in {self.rec_names[r]}."
        if verb == "transform":
            o, r = op[1], op[2]
            word, sets, clears = TRANSFORMS[self.rec_kind[r]]
            flags = list(s.flags)
            flags[o] = (flags[o] & ~clears) | sets
            s2 = s._replace(flags=tuple(flags))
            return s2, f"You {word} {self.obj_names[o]} with {self.rec_names[r]}."
        # use a lamp
        r = op[1]
        if s.held >= 0:
            examined = s.examined or s.held in self.goal_objs
            text = f"You turn on {self.rec_names[r]} and look at {self.obj_names[s.held]}."
            return s._replace(examined=examined), text
        return s, f"You turn on {self.rec_names[r]}. You hold nothing to look at."

    # --- oracle ---
    def useful_ops(self, s: State, goal_objs: frozenset[int] | None = None) -> list[Op]:
        """The admissible ops that can lie on a shortest path to the goal (using only `goal_objs`,
        default all goal objects).

        Sound pruning: closing never helps; taking, transforming or examining a non-goal object never
        helps (one hand, nothing needs it); a goal object is only ever put into the target; opening
        helps only for receptacles that hold a goal object or are the target. A held non-goal object
        may be put anywhere, so every state that can reach the goal still can under these ops.
        """
        usable = self.goal_objs if goal_objs is None else goal_objs
        out: list[Op] = []
        for op in self.ops(s):
            verb = op[0]
            if verb == "close":
                continue
            if verb == "open":
                r = op[1]
                if r != self.target and not any(s.obj_loc[o] == r for o in usable):
                    continue
            elif verb == "take":
                if op[1] not in usable:
                    continue
            elif verb == "put":
                if op[1] in self.goal_objs and op[2] != self.target:
                    continue
            elif verb == "transform":
                kind = self.goal_kind
                if op[1] not in self.goal_objs or kind not in FLAG_FOR_GOAL:
                    continue
                if TRANSFORMS[self.rec_kind[op[2]]][1] != FLAG_FOR_GOAL[kind]:
                    continue
            elif verb == "use":
                if self.goal_kind != "examine" or s.held not in self.goal_objs:
                    continue
            out.append(op)
        return out

    def shortest_path(
        self, start: State, *, goal_objs: frozenset[int] | None = None, rooms: frozenset[int] | None = None
    ) -> list[Op] | None:
        """BFS over world states: a shortest list of ops from `start` to the goal (None: unreachable),
        using only `goal_objs` and moving only among `rooms` (defaults: all)."""
        if self.achieved(start):
            return []
        parent: dict[State, tuple[State, Op] | None] = {start: None}
        queue = deque([start])
        while queue:
            s = queue.popleft()
            # Sorting keeps the chosen path deterministic across processes.
            for op in sorted(self.useful_ops(s, goal_objs)):
                if rooms is not None and op[0] == "go" and op[1] not in rooms:
                    continue
                s2, _ = self.apply(s, op)
                if s2 in parent:
                    continue
                parent[s2] = (s, op)
                if self.achieved(s2):
                    path: list[Op] = []
                    node: State = s2
                    while (link := parent[node]) is not None:
                        node, step = link
                        path.append(step)
                    return path[::-1]
                queue.append(s2)
        return None

    def distance(self, s: State) -> int | None:
        path = self.shortest_path(s)
        return None if path is None else len(path)

    # --- an expert that knows only what it has seen ---
    def searching_step(self, seen: list[State]) -> Op | None:
        """The next op of an agent that knows only what it saw in `seen` (every state it has been in,
        the current one last); None when the goal is reached. Objects move only when the agent moves
        them, so what it saw is still true. With enough seen goal objects it follows a shortest plan
        through rooms it has visited (the target's and the appliance's included); until then it takes a
        seen goal object within reach and looks: the nearest closed receptacle it never saw into (while
        goal objects are missing), else the nearest room it never entered. Ties go to the alphabetically
        first name."""
        s = seen[-1]
        if self.achieved(s):
            return None
        visited = frozenset(x.loc for x in seen)
        known: set[int] = set()
        looked: set[int] = set()
        for x in seen:
            if x.held >= 0:
                known.add(x.held)
            for r in self.room_recs[x.loc]:
                if not self.rec_openable[r] or self.is_open(x, r):
                    looked.add(r)
                    known.update(o for o, at in enumerate(x.obj_loc) if at == r)
        usable = frozenset(known & self.goal_objs)
        path = self.shortest_path(s, goal_objs=usable, rooms=visited)
        if path:
            return path[0]
        need = 2 if self.goal_kind == "pick_two" else 1
        if s.held < 0:  # a seen goal object within reach goes along while the search goes on
            for op in sorted(self.ops(s)):
                if op[0] == "take" and op[1] in usable and op[2] != self.target:
                    return op
        # rooms by distance through visited rooms (an unvisited room ends a route: its exits are unknown)
        first_go: dict[int, Op | None] = {s.loc: None}
        dist = {s.loc: 0}
        queue = deque([s.loc])
        while queue:
            room = queue.popleft()
            if room not in visited:
                continue
            for n in self.exits[room]:
                if n not in dist:
                    dist[n] = dist[room] + 1
                    first_go[n] = first_go[room] or ("go", n)
                    queue.append(n)
        options: list[tuple[int, str, Op]] = []
        for room, d in dist.items():
            go = first_go[room]
            if room not in visited:
                options.append((d, self.rooms[room], go))  # type: ignore[arg-type]
            elif len(usable) < need:
                for r in self.room_recs[room]:
                    if self.rec_openable[r] and r not in looked:
                        options.append((d + 1, self.rec_names[r], go or ("open", r)))
        if not options:  # nothing left to look at: the plan needs what only the whole world shows
            path = self.shortest_path(s)
            return path[0] if path else None
        return min(options)[2]
