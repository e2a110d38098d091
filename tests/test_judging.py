"""Judge prompt and verdict/answer parsing (pure)."""

from __future__ import annotations

import pytest

import envs
from envs.judging import judge_prompt, parse_boxed, parse_verdict


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The step opens the fridge, which is needed. \\boxed{1}", 1),
        ("Useless repetition. \\boxed{-1}", -1),
        ("\\boxed{+1}", 1),
        ("\\boxed{ -1 }", -1),
        ("\\boxed{\u22121}", -1),  # unicode minus
        # the LAST box wins, even when the reasoning quotes the format first
        ("Answer \\boxed{1} if good or \\boxed{-1} if bad. It is good: \\boxed{1}", 1),
        ("Looks fine at first \\boxed{1}, but it undoes progress: \\boxed{-1}", -1),
        ("no box at all, I think it is good", 0),
        ("\\boxed{}", 0),
        ("\\boxed{0}", 0),
        ("\\boxed{2}", 0),
        ("\\boxed{good}", 0),
        ("\\boxed{1", 0),  # unclosed, nothing earlier
        ("\\boxed{-1} then \\boxed{1", -1),  # unclosed last box falls back to the closed one
        ("", 0),
    ],
)
def test_parse_verdict(text: str, expected: int) -> None:
    assert parse_verdict(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{7*2}", "7*2"),
        ("step: \\boxed{ (3+4)*2 } ", "(3+4)*2"),
        ("\\boxed{a} \\boxed{b}", "b"),
        ("\\boxed{f(x) = {1}}", "f(x) = {1}"),
        ("nothing", None),
        ("\\boxed{3", None),
    ],
)
def test_parse_boxed(text: str, expected: str | None) -> None:
    assert parse_boxed(text) == expected


def test_judge_prompt_contains_parts_in_order() -> None:
    prompt = judge_prompt("Task: reduce (3+4)*2\nStep 1: 7*2", "\\boxed{14}", "Accepted: 14. Done.")
    i_ctx = prompt.index("reduce (3+4)*2")
    i_step = prompt.index("\\boxed{14}")
    i_obs = prompt.index("Accepted: 14")
    assert i_ctx < i_step < i_obs
    assert prompt.rstrip().endswith("\\boxed{-1} if it is a bad step.")
    assert "\\boxed{1}" in prompt


def test_registry_exports() -> None:
    assert envs.DOMAINS == ("household", "arith", "code", "textworld", "textworld-custom")
    assert envs.judge_prompt is judge_prompt and envs.parse_verdict is parse_verdict
    with pytest.raises(ValueError, match="unknown domain"):
        envs.get_environment("chess")
