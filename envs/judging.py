"""Judge prompts and answer parsing shared by every domain.

The reward model sees, for one policy step, the task and history before it, the step itself and
the environment's next observation; it reasons briefly and answers `\\boxed{1}` (a good step) or
`\\boxed{-1}` (a bad one), as in the paper's released prompts. `parse_verdict` reads the LAST
boxed answer, so a judge that restates the format in its reasoning is still read correctly;
anything else is 0 (unparseable), which the algorithm treats as an invalid verdict.

`parse_boxed` is the one answer parser the envs use for policy responses too.
"""

from __future__ import annotations

_BOXED = "\\boxed{"

# Verdict spellings a small model plausibly writes; anything else is unparseable (0).
_VERDICTS: dict[str, int] = {
    "1": 1,
    "+1": 1,
    "-1": -1,
    "\u22121": -1,  # unicode minus sign
}


def parse_boxed(text: str) -> str | None:
    """Contents of the last `\\boxed{...}` in `text` (braces balanced, stripped), else None.

    Nested braces inside the box are kept (`\\boxed{f(x) = {1}}` -> `f(x) = {1}`); an unclosed last
    box falls back to the previous closed one.
    """
    start = text.rfind(_BOXED)
    while start != -1:
        depth = 1
        i = start + len(_BOXED)
        while i < len(text):
            ch = text[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start + len(_BOXED) : i].strip()
            i += 1
        start = text.rfind(_BOXED, 0, start)
    return None


def parse_verdict(text: str) -> int:
    """+1 / -1 from the last `\\boxed{}` in a judge's answer; 0 when missing or not a verdict."""
    boxed = parse_boxed(text)
    if boxed is None:
        return 0
    return _VERDICTS.get(boxed.replace(" ", ""), 0)


def judge_prompt(context: str, step_response: str, observation: str) -> str:
    """The reward model's prompt for one step (paper style).

    `context` is `Episode.judge_context(i)`: the task and every earlier step; `step_response` is the
    policy's answer at step i; `observation` is what the environment said back to it.
    """
    return (
        "You are judging one step of an agent solving a task.\n\n"
        "## Task and history so far\n"
        f"{context.strip()}\n\n"
        "## The agent's current step\n"
        f"{step_response.strip()}\n\n"
        "## What the environment returned after this step\n"
        f"{observation.strip()}\n\n"
        "## Your judgement\n"
        "Decide whether this step makes progress towards completing the task: it is valid, it "
        "moves the agent closer to the goal, and it does not undo or repeat earlier work.\n"
        "First reason briefly (a few sentences). Then give your verdict as the last thing you "
        "write: \\boxed{1} if it is a good step, or \\boxed{-1} if it is a bad step."
    )
