"""code: oracle and wrong programs through the real sandbox, random baseline by level, variants,
unit-test parsing / running for the reward model, hostile submissions."""

from __future__ import annotations

import copy
import json
import random

import pytest

from envs import Environment, get_environment
from envs.code import (
    LEVELS,
    CodeEnv,
    extract_program,
    hidden_tests,
    level_of,
    parse_unit_tests,
    run_tests,
    task_statement,
    unit_test_prompt,
)
from envs.code_templates import TEMPLATES, compiled
from envs.sandbox import SandboxLimits
from schemas.codec import decode, encode
from schemas.events import CriticFeedback, TaskSpec

ENV = CodeEnv()
N_PER_LEVEL = 200


def _passes_trusted(response: str, task: TaskSpec) -> bool:
    """In-process check, ONLY for our own template programs (references and mutants), to measure the
    random baseline on many tasks quickly; the sandbox path is checked against it below."""
    program = extract_program(response)
    assert program is not None
    func = task.params["template"]
    spec_func = (TEMPLATES_BY[func].strict if task.params["strict"] else TEMPLATES_BY[func].basic).func
    try:
        f = compiled(program, spec_func)
    except KeyError:  # the program defines another spec's function
        return False
    for args, expected in hidden_tests(task):
        try:
            if json.dumps(f(*copy.deepcopy(args)), sort_keys=True) != json.dumps(expected, sort_keys=True):
                return False
        except Exception:
            return False
    return True


TEMPLATES_BY = {t.name: t for t in TEMPLATES}


def _random_success(tasks: list[TaskSpec]) -> float:
    """Expected success of a policy answering a uniformly random candidate program (exact per task)."""
    total = 0.0
    for task in tasks:
        candidates = ENV.candidate_programs(task)
        total += sum(_passes_trusted(c, task) for c in candidates) / len(candidates)
    return total / len(tasks)


def _tasks(level: int, n: int = N_PER_LEVEL) -> list[TaskSpec]:
    rng = random.Random(500 + level)
    return [ENV.sample_task(level, rng) for _ in range(n)]


def test_registry_and_protocol() -> None:
    env = get_environment("code")
    assert isinstance(env, Environment) and env.domain == "code" and env.levels == 4
    assert len(TEMPLATES) >= 8


@pytest.mark.timeout(120)
@pytest.mark.parametrize("level", range(len(LEVELS)))
def test_oracle_passes_every_template_in_the_sandbox(level: int) -> None:
    rng = random.Random(level)
    for template in TEMPLATES:
        task = ENV.task_for(template.name, level, rng)
        assert len(hidden_tests(task)) == task.params["n_tests"] == LEVELS[level][3]
        episode = ENV.reset(task)
        prompt = episode.prompt()
        assert "```python" in prompt and task_statement(task) in prompt
        result = episode.step(ENV.oracle(task)[0])
        assert result.done and result.valid_action
        assert episode.outcome == 1, (template.name, level, result.info)
        assert "passed" not in result.observation  # the observation does not leak the result


@pytest.mark.timeout(120)
def test_sandbox_verdicts_match_the_trusted_check() -> None:
    rng = random.Random(3)
    for i, template in enumerate(TEMPLATES):
        for level in (1 + 2 * (i % 2),):  # levels 1 and 3 alternately, to stay fast
            task = ENV.task_for(template.name, level, rng)
            for response in ENV.candidate_programs(task):
                episode = ENV.reset(task)
                episode.step(response)
                assert (episode.outcome == 1) == _passes_trusted(response, task), (template.name, response)


def test_random_policy_success_falls_with_difficulty() -> None:
    # Random baseline: a uniformly random pick among the template's candidate programs (basic and strict
    # references + typical wrong programs). Exact expectation per task, 200 tasks per level, measured:
    # levels 0..3 -> 0.315, 0.284, 0.213, 0.147.
    rates = [_random_success(_tasks(level)) for level in range(len(LEVELS))]
    assert rates[0] > rates[1] > rates[2] > rates[3], rates
    assert rates[3] < 0.2 < rates[0], rates


def test_variants_move_random_success_the_stated_way() -> None:
    rng = random.Random(11)
    critic = CriticFeedback()
    for level in (1, 2):
        parents = _tasks(level, 60)
        harder = [ENV.propose_variant(t, "harder", critic, rng) for t in parents]
        easier = [ENV.propose_variant(t, "easier", critic, rng) for t in parents]
        assert all(v is not None for v in harder + easier)
        for parent, h, e in zip(parents, harder, easier, strict=True):
            assert h.params["template"] == e.params["template"] == parent.params["template"]
            assert h.status == "pending" and h.parent_id == parent.task_id and h.direction == "harder"
            assert level_of(h.params) == level + 1 and level_of(e.params) == level - 1
            assert h.signature != parent.signature != e.signature
        base = _random_success(parents)
        assert _random_success(easier) > base > _random_success(harder), level


def test_variant_ends_of_the_ladder() -> None:
    rng = random.Random(0)
    top = ENV.task_for("fizzbuzz", 3, rng)
    chain = [top]
    while (nxt := ENV.propose_variant(chain[-1], "harder", CriticFeedback(), rng)) is not None:
        chain.append(nxt)
    assert chain[-1].params["n_examples"] == 0 and chain[-1].params["n_tests"] == 16
    bottom = ENV.task_for("fizzbuzz", 0, rng)
    chain = [bottom]
    while (nxt := ENV.propose_variant(chain[-1], "easier", CriticFeedback(), rng)) is not None:
        chain.append(nxt)
    assert chain[-1].params["n_examples"] == 3 and len(chain) == 2


def test_tasks_are_data_and_signature_ignores_the_seed() -> None:
    a = ENV.sample_task(2, random.Random(4))
    assert ENV.sample_task(2, random.Random(4)).params == a.params
    wire = decode(encode(a), TaskSpec)
    assert hidden_tests(wire) == hidden_tests(a) and a.signature == ENV.signature(a)
    reseeded = TaskSpec(task_id="x", domain="code", difficulty=2, params=dict(a.params), seed=a.seed + 1)
    assert ENV.signature(reseeded) == a.signature and hidden_tests(reseeded) != hidden_tests(a)


def test_no_code_block_is_an_invalid_action() -> None:
    task = ENV.task_for("sum_evens", 0, random.Random(0))
    episode = ENV.reset(task)
    result = episode.step("def sum_evens(nums): return 0")
    assert not result.valid_action and result.done and episode.outcome == -1
    assert not ENV.step_is_progress(task, [], "nothing")
    assert ENV.step_is_progress(task, [], ENV.oracle(task)[0])
    assert "sum_evens" in episode.judge_context(0)


def test_extract_program_takes_the_last_python_block() -> None:
    text = "First try:\n```python\ndef f(): return 1\n```\nBetter:\n```python\ndef f(): return 2\n```\n```text\nx\n```"
    assert extract_program(text) == "def f(): return 2\n"
    assert extract_program("```\ndef g(): pass\n```") == "def g(): pass\n"
    assert extract_program("no code") is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "body",
    [
        "def sum_evens(nums):\n    while True:\n        pass",  # hangs -> killed, fails
        'import sys\nprint(\'{"i": 0, "value": 0}\')\nsys.exit(0)',  # forged output, no function
        "def sum_evens(nums):\n    import os\n    os.system('true')",  # refused by the sandbox
        "def sum_evens(nums):\n    return open('/etc/hostname', 'w')",
        'import json\njson.dumps = lambda *a, **k: \'{"i": 0, "value": 1}\'\ndef sum_evens(nums):\n    return 0',
        "def sum_evens(nums)\n    return 0",  # syntax error
    ],
)
def test_hostile_or_broken_submissions_fail(body: str) -> None:
    env = CodeEnv(limits=SandboxLimits(timeout_s=1.5, cpu_s=3, memory_mb=256))
    task = env.task_for("sum_evens", 1, random.Random(9))
    episode = env.reset(task)
    result = episode.step(f"```python\n{body}\n```")
    assert result.done and episode.outcome == -1
    assert result.info["passed"] < result.info["total"]


# --- unit tests written by the reward model ---
RM_TESTS = """Here are my tests.

**Test Input:**
```
[1, 2, 3, 4]
```
**Test Output:**
```
6
```

**Test Input:** [-2, -3, 5]
**Test Output:** -2

**Test Input:**
```
[]
```
**Test Output:**
```
1
```
(this one is wrong on purpose)

**Test Input:**
```
not a literal
```
**Test Output:**
```
0
```
"""


def test_parse_unit_tests() -> None:
    assert parse_unit_tests(RM_TESTS) == [
        ("[1, 2, 3, 4]", "6"),
        ("[-2, -3, 5]", "-2"),
        ("[]", "1"),
        ("not a literal", "0"),
    ]
    assert parse_unit_tests("no tests here") == []
    two_args = "**Test Input:**\n```\n[3, 6, 7], 3\n```\n**Test Output:**\n```\n9\n```"
    assert parse_unit_tests(two_args) == [("[3, 6, 7], 3", "9")]


@pytest.mark.timeout(60)
def test_run_tests_scores_each_test_for_each_program() -> None:
    tests = parse_unit_tests(RM_TESTS)
    reference = "def sum_evens(nums):\n    return sum(x for x in nums if x % 2 == 0)\n"
    positives_only = "def sum_evens(nums):\n    return sum(x for x in nums if x > 0 and x % 2 == 0)\n"
    assert run_tests(reference, tests) == [True, True, False, False]
    assert run_tests(positives_only, tests) == [True, False, False, False]
    assert run_tests("def sum_evens(nums) return 0", tests) == [False] * 4  # does not parse
    assert run_tests(reference, []) == []
    # several arguments (one per line works too), tuple outputs compare as lists, helper functions
    helper = "def helper(x):\n    return x\n\ndef pair(a, b):\n    return (helper(b), a)\n"
    multi = [("1, 'x'", "('x', 1)"), ("2\n'y'", "['y', 2]"), ("1, 2", "(1, 2)"), ("{1}", "{1}")]
    assert run_tests(helper, multi) == [True, True, False, False]
    assert run_tests(helper, [("5", "5")], func="helper") == [True]


def test_unit_test_prompt_asks_for_the_parsed_format() -> None:
    task = ENV.task_for("merge_sorted", 2, random.Random(1))
    prompt = unit_test_prompt(task, n_tests=3)
    assert "merge_sorted" in prompt and "**Test Input:**" in prompt and "**Test Output:**" in prompt


@pytest.mark.timeout(60)
def test_reward_model_side_methods_used_by_the_judge() -> None:
    task = ENV.task_for("digit_sum", 2, random.Random(2))  # strict: digit_sum(n, base); 255 = 0xFF -> 30
    good, wrong, looping = ("255, 16", "30"), ("255, 16", "15"), ("5, 1", "5")  # base 1 never ends
    assert ENV.test_is_correct(task, good) and not ENV.test_is_correct(task, wrong)
    assert not ENV.test_is_correct(task, looping)  # the reference runs sandboxed: it times out, cleanly
    no_abs = "```python\ndef digit_sum(n, base):\n    total = 0\n    while n > 0:\n        total += n % base\n        n //= base\n    return total\n```"
    assert ENV.program_passes(task, ENV.oracle(task)[0], good)
    assert ENV.program_passes(task, no_abs, good) and not ENV.program_passes(task, no_abs, ("-255, 16", "30"))
    assert not ENV.program_passes(task, "no code", good)
    prompt = ENV.unit_test_prompt(task, no_abs)
    assert "candidate solution" in prompt and "while n > 0" in prompt
    assert ENV.parse_unit_tests(f"**Test Input:** {good[0]}\n**Test Output:** {good[1]}") == [good]


def test_the_judge_finds_the_unit_test_side_through_the_protocol() -> None:
    """Code is judged by unit tests (the judge writes tests); verdict domains give None; a domain that
    says unit tests but lacks the methods fails loudly instead of being judged by verdicts."""
    from envs.base import UnitTestJudged, judged_by_unit_tests

    code = get_environment("code")
    assert judged_by_unit_tests(code) is code and isinstance(code, UnitTestJudged)
    assert judged_by_unit_tests(get_environment("household")) is None

    class Claims(type(get_environment("arith"))):  # a verdict domain that says otherwise
        judged_by = "unit_tests"

    with pytest.raises(TypeError, match="UnitTestJudged"):
        judged_by_unit_tests(Claims())
