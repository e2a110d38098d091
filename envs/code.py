"""code: write one Python function from a templated statement; hidden unit tests decide (single turn).

The policy answers with the function in a ```python block. Its program runs in envs.sandbox with
every hidden test in one process; the child only prints the function's return values (JSON, tagged
with a per-run nonce) and the parent compares them with the expected outputs, which never enter the
sandbox. Outcome +1 iff every hidden test passes. The observation is deliberately neutral (it does not
reveal the test results: in this domain the reward model writes tests instead of reading them).

Knobs (TaskSpec.params): template (family), strict (stricter signature: one more parameter that
changes the contract), n_edge (how many edge cases the hidden tests include: empty inputs, negatives,
duplicates…; 0..4),
n_tests, n_examples (visible examples in the prompt). The hidden tests are rebuilt from the seed.
Signature: the problem itself (template and knobs), not the seed, so re-seeding is not a new task.

For the reward model in this domain: `parse_unit_tests(text)` reads `**Test Input:**` /
`**Test Output:**` blocks (input = the call's arguments as Python literals, e.g. `[1, 2], 3`;
output = the return value as a Python literal) and `run_tests(program, tests)` runs them in the
sandbox (CURE-style scoring lives in algorithm/).
"""

from __future__ import annotations

import ast
import copy
import functools
import json
import random
import re
import secrets
from typing import Any, Literal

import msgspec

from envs.base import Direction, StepResult
from envs.code_templates import BY_NAME, TEMPLATES, Args, Spec, Template, compiled
from envs.sandbox import SandboxLimits, run_python
from schemas.events import CriticFeedback, TaskSpec

# Difficulty levels, easiest first: (families drawn from, strict, n_edge, n_tests, n_examples).
# (strict, n_edge) is the ladder variants climb; it was chosen so that a random pick among the
# template's candidate programs succeeds less at every rung (see tests/test_code_env.py).
LEVELS: tuple[tuple[tuple[int, ...], bool, int, int, int], ...] = (
    ((0,), False, 0, 5, 2),
    ((0, 1), False, 1, 6, 1),
    ((0, 1), True, 2, 8, 1),
    ((0, 1), True, 4, 10, 0),
)
MAX_TESTS = 16
MAX_EXAMPLES = 3
LIMITS = SandboxLimits(timeout_s=5.0, cpu_s=5, memory_mb=256)
# Our references are linear on small inputs; a written test that makes them run longer is wrong.
REFERENCE_LIMITS = SandboxLimits(timeout_s=2.0, cpu_s=2, memory_mb=256)

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_TEST_BLOCK = re.compile(
    r"\*\*Test Input:?\*\*:?(.*?)\*\*Test Output:?\*\*:?(.*?)(?=\*\*Test Input|\Z)", re.DOTALL
)

# The child: reads {program, func, cases, nonce} from stdin BEFORE running the model's code, then
# prints one tagged JSON line per case. Expected outputs are never sent.
_HARNESS = r"""
import json, sys
_p = json.loads(sys.stdin.read())
_emit = sys.__stdout__.write
_ns = {"__name__": "solution"}
exec(compile(_p["program"], "solution.py", "exec"), _ns)
_f = _ns.get(_p["func"])
for _i, _args in enumerate(_p["cases"]):
    try:
        if not callable(_f):
            raise NameError("function " + _p["func"] + " is not defined")
        _line = json.dumps({"i": _i, "value": _f(*_args)}, sort_keys=True)
    except Exception as _e:
        _line = json.dumps({"i": _i, "error": type(_e).__name__})
    _emit("\n" + _p["nonce"] + _line + "\n")
    sys.__stdout__.flush()
"""


# --- programs and tests ---
def extract_program(response: str) -> str | None:
    """The last ```python block of a response (else the last fenced block of any language)."""
    blocks = _FENCE.findall(response)
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    chosen = python or [body for _, body in blocks]
    return chosen[-1].strip() + "\n" if chosen else None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)  # bool/int/str distinct, tuples == lists


def _run_cases(program: str, func: str, cases: list[Args], limits: SandboxLimits) -> list[str | None]:
    """Canonical JSON of each call's return value, None where the call failed or never ran."""
    nonce = secrets.token_hex(16)
    payload = json.dumps({"program": program, "func": func, "cases": cases, "nonce": nonce})
    result = run_python(_HARNESS, stdin=payload, limits=limits)
    outputs: list[str | None] = [None] * len(cases)
    for line in result.stdout.splitlines():
        if not line.startswith(nonce):
            continue
        try:
            record = json.loads(line[len(nonce) :])
            i = record["i"]
            if isinstance(i, int) and 0 <= i < len(cases) and outputs[i] is None and "value" in record:
                outputs[i] = _canonical(record["value"])
        except (ValueError, KeyError, TypeError):
            continue
    return outputs


def parse_unit_tests(text: str) -> list[tuple[str, str]]:
    """(input, output) text pairs from `**Test Input:**` / `**Test Output:**` blocks, in order.

    Fenced blocks are unwrapped; unfenced text is taken up to the first blank line. The texts are
    returned raw, so a malformed test still counts (run_tests scores it False for every program)."""

    def unwrap(chunk: str) -> str:
        fenced = _FENCE.search(chunk)
        if fenced:
            return fenced.group(2).strip()
        return chunk.strip().split("\n\n")[0].strip()

    return [(unwrap(i), unwrap(o)) for i, o in _TEST_BLOCK.findall(text)]


def _literal_args(text: str) -> Args | None:
    for candidate in (text, ", ".join(line for line in text.splitlines() if line.strip())):
        try:
            value = ast.literal_eval(f"({candidate},)")
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        return list(value)
    return None


def _literal(text: str) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None


def _last_function(program: str) -> str | None:
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError):
        return None
    names = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    return names[-1] if names else None


def run_tests(
    program: str,
    tests: list[tuple[str, str]],
    *,
    func: str | None = None,
    limits: SandboxLimits = LIMITS,
) -> list[bool]:
    """Whether `program` passes each (input, output) test, run in the sandbox in one process.

    `func` defaults to the last top-level function the program defines. A test whose input or output
    does not parse as Python literals is False; so is every test when the program does not parse."""
    func = func or _last_function(program)
    parsed: list[tuple[Args, str] | None] = []
    for input_text, output_text in tests:
        args = _literal_args(input_text)
        ok, expected = _literal(output_text)
        try:
            parsed.append((args, _canonical(expected)) if args is not None and ok else None)
        except (TypeError, ValueError):  # e.g. a set literal: not a JSON value
            parsed.append(None)
    runnable = [p for p in parsed if p is not None]
    if func is None or not runnable:
        return [False] * len(tests)
    outputs = iter(_run_cases(program, func, [args for args, _ in runnable], limits))
    return [p is not None and next(outputs) == p[1] for p in parsed]


# --- tasks ---
def _template(task: TaskSpec) -> tuple[Template, Spec]:
    template = BY_NAME[task.params["template"]]
    return template, template.strict if task.params.get("strict") else template.basic


def hidden_tests(task: TaskSpec) -> list[tuple[Args, Any]]:
    """The hidden (arguments, expected) pairs, rebuilt from the spec and its seed."""
    template, spec = _template(task)
    strict, n_tests = bool(task.params.get("strict")), int(task.params["n_tests"])
    rng = random.Random(task.seed)
    cases = template.edge(strict)[: min(int(task.params.get("n_edge", 0)), n_tests)]
    while len(cases) < n_tests:
        cases.append(template.typical(rng, strict))
    reference = compiled(spec.reference, spec.func)
    return [(args, reference(*copy.deepcopy(args))) for args in cases]


def _examples(task: TaskSpec) -> list[tuple[Args, Any]]:
    template, spec = _template(task)
    rng = random.Random(task.seed + 1_000_003)
    reference = compiled(spec.reference, spec.func)
    out = []
    for _ in range(int(task.params.get("n_examples", 0))):
        args = template.typical(rng, bool(task.params.get("strict")))
        out.append((args, reference(*copy.deepcopy(args))))
    return out


def _call(func: str, args: Args) -> str:
    return f"{func}({', '.join(repr(a) for a in args)})"


def task_statement(task: TaskSpec) -> str:
    """The problem as the policy (and a test-writing reward model) sees it."""
    _, spec = _template(task)
    lines = [f"Task: {spec.doc}", f"Signature: {spec.signature}"]
    examples = _examples(task)
    if examples:
        lines.append("Examples:")
        lines += [f"  {_call(spec.func, args)} == {value!r}" for args, value in examples]
    return "\n".join(lines)


def unit_test_prompt(task: TaskSpec, step_response: str = "", n_tests: int = 4) -> str:
    """Prompt asking the reward model for unit tests in the format `parse_unit_tests` reads; when the
    policy's answer is given it is shown as a candidate to find bugs in (it may be right or wrong)."""
    _, spec = _template(task)
    program = extract_program(step_response) if step_response else None
    candidate = (
        f"A candidate solution (it may be wrong):\n```python\n{program}```\n\n" if program is not None else ""
    )
    return (
        f"{task_statement(task)}\n\n{candidate}"
        f"Write {n_tests} unit tests for `{spec.func}` that a wrong solution would fail, including edge "
        "cases. For each test write the arguments of one call as Python literals separated by commas, "
        "and the expected return value as a Python literal, exactly in this format:\n"
        "**Test Input:**\n```\n<arguments>\n```\n**Test Output:**\n```\n<return value>\n```"
    )


@functools.lru_cache(maxsize=4096)
def _reference_passes(template: str, strict: bool, test: tuple[str, str]) -> bool:
    spec = BY_NAME[template].strict if strict else BY_NAME[template].basic
    # Even our reference runs in the sandbox here: test inputs are model-written (e.g. base=1 loops).
    return run_tests(spec.reference, [test], func=spec.func, limits=REFERENCE_LIMITS)[0]


def level_of(params: dict[str, Any]) -> int:
    """The highest level whose (strict, n_edge) rung the params reach."""
    reached = [
        i
        for i, (_, strict, n_edge, _, _) in enumerate(LEVELS)
        if bool(params.get("strict")) >= strict and int(params.get("n_edge", 0)) >= n_edge
    ]
    return max(reached, default=0)


class CodeEpisode:
    max_steps = 1

    def __init__(self, task: TaskSpec, limits: SandboxLimits = LIMITS) -> None:
        self.task = task
        self.limits = limits
        self._outcome: Literal[1, -1] | None = None
        self.response: str | None = None

    @property
    def done(self) -> bool:
        return self._outcome is not None

    @property
    def outcome(self) -> Literal[1, -1]:
        return self._outcome if self._outcome is not None else -1

    def prompt(self) -> str:
        return (
            "Write a Python function that solves the task below. Hidden unit tests will call it.\n\n"
            f"{task_statement(self.task)}\n\n"
            "Use only the standard library, do not read input or print. Think briefly if you need to, then "
            "give the complete function in a single ```python code block."
        )

    def step(self, response: str) -> StepResult:
        if self.done:
            raise RuntimeError("episode is over")
        self.response = response
        program = extract_program(response)
        if program is None:
            self._outcome = -1
            return StepResult("No ```python code block found; nothing was run.", True, False, {"passed": 0})
        _, spec = _template(self.task)
        cases = hidden_tests(self.task)
        outputs = _run_cases(program, spec.func, [args for args, _ in cases], self.limits)
        passed = sum(out == _canonical(expected) for out, (_, expected) in zip(outputs, cases, strict=True))
        self._outcome = 1 if passed == len(cases) else -1
        observation = f"Program submitted ({len(program.splitlines())} lines); the hidden tests were run."
        return StepResult(observation, True, True, {"passed": passed, "total": len(cases)})

    def judge_context(self, step_index: int) -> str:
        return "A coding task.\n" + task_statement(self.task)


class CodeEnv:
    domain = "code"
    judged_by = "unit_tests"
    levels = len(LEVELS)

    def __init__(self, limits: SandboxLimits = LIMITS) -> None:
        self.limits = limits  # for the hidden-test runs of every episode

    def _make(self, params: dict[str, Any], rng: random.Random, **extra: Any) -> TaskSpec:
        task = TaskSpec(
            task_id=f"code-{rng.getrandbits(48):012x}",
            domain="code",
            difficulty=level_of(params),
            params=params,
            seed=rng.randrange(2**31),
            **extra,
        )
        return msgspec.structs.replace(task, signature=self.signature(task))

    def sample_task(self, difficulty: int, rng: random.Random) -> TaskSpec:
        if not 0 <= difficulty < self.levels:
            raise ValueError(f"code difficulty must be in 0..{self.levels - 1}, got {difficulty}")
        families = LEVELS[difficulty][0]
        template = rng.choice([t for t in TEMPLATES if t.family in families])
        return self.task_for(template.name, difficulty, rng)

    def task_for(self, template: str, difficulty: int, rng: random.Random) -> TaskSpec:
        """A task of one template at a level's knobs (tests cover every template x level)."""
        _, strict, n_edge, n_tests, n_examples = LEVELS[difficulty]
        params = {
            "template": template,
            "strict": strict,
            "n_edge": n_edge,
            "n_tests": n_tests,
            "n_examples": n_examples,
        }
        task = self._make(params, rng)
        return msgspec.structs.replace(task, difficulty=difficulty)

    def reset(self, task: TaskSpec) -> CodeEpisode:
        return CodeEpisode(task, self.limits)

    def oracle(self, task: TaskSpec) -> list[str]:
        _, spec = _template(task)
        return [f"```python\n{spec.reference}```"]

    def candidate_programs(self, task: TaskSpec) -> list[str]:
        """The random baseline's choices: this template's references and typical wrong programs
        (basic and strict specs alike), as responses."""
        template, _ = _template(task)
        sources = [
            template.basic.reference,
            *template.basic.mutants,
            template.strict.reference,
            *template.strict.mutants,
        ]
        return [f"```python\n{src}```" for src in sources]

    # --- the reward model's side in this domain (used by consumers/judge.py) ---
    def unit_test_prompt(self, task: TaskSpec, step_response: str = "", n_tests: int = 4) -> str:
        return unit_test_prompt(task, step_response, n_tests)

    def parse_unit_tests(self, text: str) -> list[tuple[str, str]]:
        return parse_unit_tests(text)

    def test_is_correct(self, task: TaskSpec, test: tuple[str, str]) -> bool:
        """A written test is correct iff the task's reference solution passes it (cached per spec)."""
        return _reference_passes(task.params["template"], bool(task.params.get("strict")), tuple(test))

    def program_passes(self, task: TaskSpec, response: str, test: tuple[str, str]) -> bool:
        """Whether the policy's answer (a response with a ```python block) passes one written test."""
        program = extract_program(response)
        _, spec = _template(task)
        return (
            program is not None and run_tests(program, [tuple(test)], func=spec.func, limits=self.limits)[0]
        )

    def signature(self, task: TaskSpec) -> str:
        p = task.params
        return (
            f"code:{p['template']}:strict={bool(p.get('strict'))}:edge={p.get('n_edge', 0)}"
            f":tests={p['n_tests']}:examples={p.get('n_examples', 0)}"
        )

    def step_is_progress(self, task: TaskSpec, history: list[str], response: str) -> bool:
        episode = self.reset(task)
        return not history and episode.step(response).info.get("passed") == int(task.params["n_tests"])

    def propose_variant(
        self,
        task: TaskSpec,
        direction: Direction,
        critic: CriticFeedback,
        rng: random.Random,
    ) -> TaskSpec | None:
        """Harder: the next (strict, n_edge) rung of LEVELS (same template), past the top fewer
        examples then more tests. Easier: the previous rung, below the bottom more examples.
        None when no knob can move that way."""
        p = dict(task.params)
        rung = level_of(p)
        exact = (bool(p.get("strict")), int(p.get("n_edge", 0))) == LEVELS[rung][1:3]
        if direction == "harder":
            if rung + 1 < len(LEVELS):
                _, strict, n_edge, n_tests, n_examples = LEVELS[rung + 1]
                p["strict"], p["n_edge"] = (
                    bool(p.get("strict")) or strict,
                    max(int(p.get("n_edge", 0)), n_edge),
                )
                p["n_tests"], p["n_examples"] = (
                    max(p["n_tests"], n_tests),
                    min(p.get("n_examples", 0), n_examples),
                )
            elif p.get("n_examples", 0) > 0:
                p["n_examples"] -= 1
            elif p["n_tests"] < MAX_TESTS:
                p["n_tests"] = min(MAX_TESTS, p["n_tests"] + 4)
            else:
                return None
        else:
            target = rung - 1 if exact else rung  # off-ladder params drop to the rung they reach
            if target >= 0:
                _, strict, n_edge, n_tests, n_examples = LEVELS[target]
                p["strict"], p["n_edge"] = (
                    bool(p.get("strict")) and strict,
                    min(int(p.get("n_edge", 0)), n_edge),
                )
                p["n_tests"], p["n_examples"] = (
                    min(p["n_tests"], n_tests),
                    max(p.get("n_examples", 0), n_examples),
                )
            elif p.get("n_examples", 0) < MAX_EXAMPLES:
                p["n_examples"] = p.get("n_examples", 0) + 1
            else:
                return None
        return self._make(
            p,
            rng,
            status="pending",
            parent_id=task.task_id,
            direction=direction,
            generation=task.generation + 1,
        )


__all__ = [
    "CodeEnv",
    "CodeEpisode",
    "extract_program",
    "hidden_tests",
    "parse_unit_tests",
    "run_tests",
    "task_statement",
    "unit_test_prompt",
]
