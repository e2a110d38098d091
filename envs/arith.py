"""arith: reduce an integer expression one operation per turn (multi-step, single answer per turn).

Each turn the policy sees the expression and the lines accepted so far and answers
`\\boxed{<next line>}`: e.g. "(3+4)*2" -> "7*2" -> "14".

Validity (the strict choice, documented): a line is accepted iff, parsed as an expression tree
(ints, + - *, parentheses; a negative number may be written -4 or (-4)), it equals the current tree
with exactly ONE operation whose operands are both numbers replaced by its value. Any such operation
may be chosen (not only the leftmost), formatting is free (spaces, redundant parentheses), but
re-associating ("2+3+4" -> "2+7") or skipping ahead ("(3+4)*2" -> "14") is rejected, because the
reward model judges individual lines. A rejected line leaves the state unchanged and costs a turn.
Outcome +1 iff a single number (necessarily the right value) is reached within
max_steps = n_ops + slack turns.

Knobs (TaskSpec.params): ops, n_ops, max_operand, max_depth (parentheses nesting), slack; the
expression itself is stored too, so the task is plain data. Oracle: greedy, reduces the leftmost
innermost operation (every valid step removes exactly one operation, so it is also the shortest).
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass
from typing import Literal

import msgspec

from envs.base import Direction, StepResult
from envs.judging import parse_boxed
from schemas.events import CriticFeedback, TaskSpec

Tree = int | tuple[str, "Tree", "Tree"]

# Difficulty levels, easiest first: (ops, n_ops, max_operand, max_depth).
LEVELS: tuple[tuple[str, int, int, int], ...] = (
    ("+-", 2, 9, 0),
    ("+-*", 3, 9, 1),
    ("+-*", 4, 20, 1),
    ("+-*", 5, 30, 2),
    ("+-*", 6, 50, 3),
)
SLACK = 2  # extra turns beyond the n_ops a perfect solver needs
MAX_OPS = 10
MAX_OPERAND = 999
MAX_LINE_CHARS = 400

_PREC = {"+": 1, "-": 1, "*": 2}
_AST_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}


# --- trees ---
def apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def evaluate(tree: Tree) -> int:
    if isinstance(tree, int):
        return tree
    op, left, right = tree
    return apply(op, evaluate(left), evaluate(right))


def count_ops(tree: Tree) -> int:
    return 0 if isinstance(tree, int) else 1 + count_ops(tree[1]) + count_ops(tree[2])


def render(tree: Tree, *, top: bool = True) -> str:
    """Minimal-parentheses text whose parse is exactly `tree` (negative numbers as (-4) inside)."""
    if isinstance(tree, int):
        return str(tree) if tree >= 0 or top else f"({tree})"
    op, left, right = tree
    ls, rs = render(left, top=False), render(right, top=False)
    if not isinstance(left, int) and _PREC[left[0]] < _PREC[op]:
        ls = f"({ls})"
    if not isinstance(right, int) and _PREC[right[0]] <= _PREC[op]:
        rs = f"({rs})"
    return f"{ls}{op}{rs}"


def paren_depth(tree: Tree) -> int:
    depth = best = 0
    for ch in render(tree):
        depth += ch == "("
        depth -= ch == ")"
        best = max(best, depth)
    return best


def parse_line(text: str) -> Tree | None:
    """The expression tree of a line, or None if it is not an int/+/-/* expression."""
    text = (
        text.replace("\u2212", "-").replace("\u00d7", "*").replace("\u00b7", "*").strip().rstrip("=").strip()
    )
    if not text or len(text) > MAX_LINE_CHARS:
        return None
    try:
        node = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        return None

    def conv(n: ast.AST) -> Tree | None:
        if isinstance(n, ast.Constant) and type(n.value) is int:
            return n.value
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            inner = n.operand
            if isinstance(inner, ast.Constant) and type(inner.value) is int:
                return -inner.value
            return None
        if isinstance(n, ast.BinOp) and type(n.op) in _AST_OPS:
            left, right = conv(n.left), conv(n.right)
            if left is None or right is None:
                return None
            return (_AST_OPS[type(n.op)], left, right)
        return None

    return conv(node)


def reductions(tree: Tree) -> list[Tree]:
    """Every tree reachable by evaluating one operation whose operands are both numbers."""
    if isinstance(tree, int):
        return []
    op, left, right = tree
    if isinstance(left, int) and isinstance(right, int):
        return [apply(op, left, right)]
    return [(op, sub, right) for sub in reductions(left)] + [(op, left, sub) for sub in reductions(right)]


def oracle_step(tree: Tree) -> tuple[Tree, str]:
    """Reduce the leftmost innermost operation; returns the new tree and a one-line explanation."""
    assert not isinstance(tree, int)
    op, left, right = tree
    if isinstance(left, int) and isinstance(right, int):
        value = apply(op, left, right)
        return value, f"{render(left, top=False)}{op}{render(right, top=False)} = {value}"
    if not isinstance(left, int):
        sub, why = oracle_step(left)
        return (op, sub, right), why
    sub, why = oracle_step(right)
    return (op, left, sub), why


def random_tree(rng: random.Random, ops: str, n_ops: int, max_operand: int) -> Tree:
    if n_ops == 0:
        return rng.randint(1, max_operand)
    k = rng.randint(0, n_ops - 1)
    return (
        rng.choice(ops),
        random_tree(rng, ops, k, max_operand),
        random_tree(rng, ops, n_ops - 1 - k, max_operand),
    )


def generate(rng: random.Random, ops: str, n_ops: int, max_operand: int, max_depth: int) -> Tree:
    """A random expression with exactly n_ops operations and parentheses nesting <= max_depth,
    preferring nesting == max_depth (so the depth knob is felt)."""
    fallback: Tree | None = None
    for _ in range(400):
        tree = random_tree(rng, ops, n_ops, max_operand)
        depth = paren_depth(tree)
        if depth == max_depth:
            return tree
        if depth < max_depth and fallback is None:
            fallback = tree
    if fallback is not None:
        return fallback
    # A left-leaning chain never needs parentheses.
    tree = rng.randint(1, max_operand)
    for _ in range(n_ops):
        tree = (rng.choice(ops), tree, rng.randint(1, max_operand))
    return tree


# --- episodes ---
@dataclass
class _Turn:
    response: str
    observation: str
    valid: bool


class ArithEpisode:
    def __init__(self, task: TaskSpec) -> None:
        self.task = task
        self.start: Tree = _task_tree(task)
        self.tree: Tree = self.start
        self.lines: list[str] = []  # accepted lines, in order
        self.turns: list[_Turn] = []
        self.max_steps = count_ops(self.start) + int(task.params.get("slack", SLACK))

    @property
    def done(self) -> bool:
        return isinstance(self.tree, int) or len(self.turns) >= self.max_steps

    @property
    def outcome(self) -> Literal[1, -1]:
        return 1 if isinstance(self.tree, int) else -1

    def _header(self) -> str:
        return (
            f"Simplify the arithmetic expression one operation per line.\nExpression: {render(self.start)}\n"
        )

    def prompt(self) -> str:
        lines = "".join(f"  {i + 1}. {line}\n" for i, line in enumerate(self.lines)) or "  (none yet)\n"
        last = (
            f"Last answer: {self.turns[-1].observation}\n" if self.turns and not self.turns[-1].valid else ""
        )
        return (
            self._header()
            + f"Lines so far:\n{lines}{last}"
            + "Rules: the next line is the current line with exactly ONE operation whose operands are "
            "both numbers replaced by its result, following the order of operations (parentheses "
            "first, * before + and -, left to right); everything else is copied unchanged. Write "
            "negative numbers in parentheses, e.g. (-4). When a single number is left you are done.\n"
            f"Current line: {render(self.tree)}\n"
            f"Turn {len(self.turns) + 1} of at most {self.max_steps}. Think briefly if you need to, then "
            "answer with the next line only, as \\boxed{<next line>}."
        )

    def check(self, response: str) -> tuple[Tree | None, str]:
        """(new tree or None, observation) for a response, without changing the episode."""
        line = parse_boxed(response)
        current = render(self.tree)
        if line is None:
            return None, f"No \\boxed{{}} answer found; the current line stays {current}."
        new = parse_line(line)
        if new is None:
            return None, f"Rejected: {line!r} is not an integer expression; the current line stays {current}."
        if new not in reductions(self.tree):
            return None, (
                f"Rejected: {line!r} is not {current} with exactly one operation evaluated; "
                f"the current line stays {current}."
            )
        if isinstance(new, int):
            return new, f"Accepted: {new}. That is the final value."
        return new, f"Accepted. Current line: {render(new)}"

    def step(self, response: str) -> StepResult:
        if self.done:
            raise RuntimeError("episode is over")
        new, observation = self.check(response)
        valid = new is not None
        if new is not None:
            self.tree = new
            self.lines.append(render(new))
        self.turns.append(_Turn(response, observation, valid))
        return StepResult(
            observation=observation,
            done=self.done,
            valid_action=valid,
            info={"line": self.lines[-1] if valid else None, "ops_left": count_ops(self.tree)},
        )

    def judge_context(self, step_index: int) -> str:
        parts = [self._header().rstrip()]
        for i, turn in enumerate(self.turns[:step_index]):
            answer = parse_boxed(turn.response)
            shown = f"\\boxed{{{answer}}}" if answer is not None else turn.response.strip()[-200:]
            parts.append(f"Step {i + 1}: {shown}\nEnvironment: {turn.observation}")
        return "\n".join(parts)

    def candidate_lines(self) -> list[tuple[str, bool]]:
        """Plausible next lines, each with whether it is valid: every valid reduction plus typical
        mistakes (off-by-one results, the wrong operation, order-of-operations and skip-ahead errors).
        The random baseline policy picks among these uniformly."""
        tree = self.tree
        valid = reductions(tree)
        out: dict[str, bool] = {render(t): True for t in valid}

        def wrong(t: Tree) -> None:
            text = render(t)
            if text not in out:
                out[text] = False

        for t in _wrong_values(tree):
            wrong(t)
        for t in _reassociations(tree):
            if t not in valid:
                wrong(t)
        if count_ops(tree) >= 2:
            for t in valid:
                for t2 in reductions(t)[:1]:
                    wrong(t2)  # two operations at once
        return list(out.items())


def _wrong_values(tree: Tree) -> list[Tree]:
    """Reductions with a wrong result: value +-1 and the result of another operator."""
    if isinstance(tree, int):
        return []
    op, left, right = tree
    if isinstance(left, int) and isinstance(right, int):
        value = apply(op, left, right)
        other = apply("+" if op == "*" else "*", left, right)
        return [v for v in (value + 1, value - 1, other) if v != value]
    return [(op, sub, right) for sub in _wrong_values(left)] + [
        (op, left, sub) for sub in _wrong_values(right)
    ]


def _reassociations(tree: Tree) -> list[Tree]:
    """Order-of-operations mistakes: 'a op1 (b op2 c)' style regroupings that evaluate b op2 c's
    neighbour first, e.g. 2+3*4 -> 5*4, and (a op b) op c -> a op (b op c) evaluated early."""
    if isinstance(tree, int):
        return []
    op, left, right = tree
    out: list[Tree] = []
    if not isinstance(left, int) and isinstance(left[2], int) and isinstance(right, int):
        # (x op1 b) op c  ->  x op1 (b op c)
        out.append((left[0], left[1], apply(op, left[2], right)))
    if isinstance(left, int) and not isinstance(right, int) and isinstance(right[1], int):
        # a op (b op2 y)  ->  (a op b) op2 y
        out.append((right[0], apply(op, left, right[1]), right[2]))
    out += [(op, sub, right) for sub in _reassociations(left)]
    out += [(op, left, sub) for sub in _reassociations(right)]
    return out


def _task_tree(task: TaskSpec) -> Tree:
    p = task.params
    if "expression" in p:
        tree = parse_line(str(p["expression"]))
        if tree is None or isinstance(tree, int):
            raise ValueError(f"arith task {task.task_id}: bad expression {p['expression']!r}")
        return tree
    return generate(random.Random(task.seed), p["ops"], p["n_ops"], p["max_operand"], p["max_depth"])


# --- the environment ---
class ArithEnv:
    domain = "arith"
    judged_by = "verdicts"
    levels = len(LEVELS)

    def _make(
        self,
        knobs: dict[str, object],
        difficulty: int,
        rng: random.Random,
        **extra: object,
    ) -> TaskSpec:
        seed = rng.randrange(2**31)
        tree = generate(
            random.Random(seed),
            str(knobs["ops"]),
            int(knobs["n_ops"]),  # type: ignore[call-overload]
            int(knobs["max_operand"]),  # type: ignore[call-overload]
            int(knobs["max_depth"]),  # type: ignore[call-overload]
        )
        params = dict(knobs, expression=render(tree))
        task = TaskSpec(
            task_id=f"arith-{rng.getrandbits(48):012x}",
            domain="arith",
            difficulty=difficulty,
            params=params,
            seed=seed,
            **extra,  # type: ignore[arg-type]
        )
        return _with_signature(task)

    def sample_task(self, difficulty: int, rng: random.Random) -> TaskSpec:
        if not 0 <= difficulty < self.levels:
            raise ValueError(f"arith difficulty must be in 0..{self.levels - 1}, got {difficulty}")
        ops, n_ops, max_operand, max_depth = LEVELS[difficulty]
        knobs = {
            "ops": ops,
            "n_ops": n_ops,
            "max_operand": max_operand,
            "max_depth": max_depth,
            "slack": SLACK,
        }
        return self._make(knobs, difficulty, rng)

    def reset(self, task: TaskSpec) -> ArithEpisode:
        return ArithEpisode(task)

    def oracle(self, task: TaskSpec) -> list[str]:
        tree = _task_tree(task)
        responses = []
        while not isinstance(tree, int):
            tree, why = oracle_step(tree)
            responses.append(f"{why}, so the next line is \\boxed{{{render(tree)}}}")
        return responses

    def signature(self, task: TaskSpec) -> str:
        return f"arith:{render(_task_tree(task))}|slack={task.params.get('slack', SLACK)}"

    def step_is_progress(self, task: TaskSpec, history: list[str], response: str) -> bool:
        episode = self.reset(task)
        for earlier in history:
            if episode.done:
                return False
            episode.step(earlier)
        return not episode.done and episode.check(response)[0] is not None

    def propose_variant(
        self,
        task: TaskSpec,
        direction: Direction,
        critic: CriticFeedback,
        rng: random.Random,
    ) -> TaskSpec | None:
        """Harder: one more operation (or, at the cap, '*' / wider operands / deeper parentheses).
        Easier: one operation fewer (or narrower operands). The oracle length moves by one each
        time the operation count moves; None when no knob can move that way."""
        p = task.params
        knobs = {
            "ops": str(p.get("ops", "+-*")),
            "n_ops": count_ops(_task_tree(task)),
            "max_operand": int(p.get("max_operand", 9)),
            "max_depth": int(p.get("max_depth", 1)),
            "slack": int(p.get("slack", SLACK)),
        }
        if direction == "harder":
            if knobs["n_ops"] < MAX_OPS:
                knobs["n_ops"] += 1
                if "*" not in knobs["ops"]:
                    knobs["ops"] += "*"
            elif knobs["max_operand"] < MAX_OPERAND:
                knobs["max_operand"] = min(MAX_OPERAND, knobs["max_operand"] * 2)
            else:
                return None
            knobs["max_depth"] = min(knobs["max_depth"] + (knobs["n_ops"] % 2), knobs["n_ops"] - 1, 4)
            difficulty = min(task.difficulty + 1, self.levels - 1)
        else:
            if knobs["n_ops"] > 1:
                knobs["n_ops"] -= 1
            elif knobs["max_operand"] > 2:
                knobs["max_operand"] = max(2, knobs["max_operand"] // 2)
            else:
                return None
            knobs["max_depth"] = max(0, min(knobs["max_depth"], knobs["n_ops"] - 1))
            difficulty = max(task.difficulty - 1, 0)
        return self._make(
            knobs,
            difficulty,
            rng,
            status="pending",
            parent_id=task.task_id,
            direction=direction,
            generation=task.generation + 1,
        )


def _with_signature(task: TaskSpec) -> TaskSpec:
    return msgspec.structs.replace(task, signature=ArithEnv().signature(task))
