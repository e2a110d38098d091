"""Task domains behind one `Environment` interface (see envs/base.py).

`get_environment(domain)` builds a domain's environment; domain modules are imported lazily so a
process that only needs arith never imports household (and vice versa). Judge prompt helpers
live in envs/judging.py and are re-exported here.
"""

from __future__ import annotations

import functools
import importlib

from envs.base import Direction, Environment, Episode, StepResult
from envs.judging import judge_prompt, parse_boxed, parse_verdict

# domain -> (module, class); modules are imported on first use.
_REGISTRY: dict[str, tuple[str, str]] = {
    "household": ("envs.household", "HouseholdEnv"),
    "arith": ("envs.arith", "ArithEnv"),
    "code": ("envs.code", "CodeEnv"),
    "textworld": ("envs.textworld", "TextWorldEnv"),
    "textworld-custom": ("envs.textworld", "TextWorldCustomEnv"),
}

DOMAINS: tuple[str, ...] = tuple(_REGISTRY)


@functools.cache
def shared_environment(domain: str) -> Environment:
    """One environment per domain and process, for roles that step many tasks (actors, judges, env model)."""
    return get_environment(domain)


def get_environment(domain: str) -> Environment:
    """A fresh environment for `domain` (one of DOMAINS); environments are stateless, cheap to build."""
    try:
        module_name, class_name = _REGISTRY[domain]
    except KeyError:
        raise ValueError(f"unknown domain {domain!r}; expected one of {', '.join(DOMAINS)}") from None
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls()


__all__ = [
    "DOMAINS",
    "shared_environment",
    "Direction",
    "Environment",
    "Episode",
    "StepResult",
    "get_environment",
    "judge_prompt",
    "parse_boxed",
    "parse_verdict",
]
