"""The architecture as the imports draw it: no arrow back up, no role importing another, no cycle.

Every import counts, the ones inside functions too (a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Lower layers never import higher ones; packages of one layer never import each other.
LAYER = {
    "schemas": 0,
    "algorithm": 0,
    "infra": 1,
    "envs": 2,
    "pipeline": 3,
    "producers": 4,
    "consumers": 4,
    "learners": 4,
    "app": 5,
}
# What the learner roles share; each other module of a role package is a role of its own.
LEARNERS_SHARED = {"learners", "learners.core", "learners.engine", "learners.checkpoint", "learners.bootstrap",
                   "learners.tiny_preset"}  # fmt: skip


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in LAYER for p in sorted((ROOT / package).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports (a `from m import x` counts as m.x where that is a module)."""
    found: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts and ".".join(parts) != name:
                found.add(".".join(parts))
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def test_the_import_reader_sees_every_kind_of_import(graph: dict[str, set[str]]) -> None:
    """Positive controls: a plain, a lazy (inside a function) and a from-package import are all seen."""
    assert "infra.bus" in graph["consumers.judge"]
    assert "learners.tiny_preset" in graph["app.cli"]  # imported inside a function
    assert "learners.core" in graph["learners.policy"]
    assert len(graph) > 80


def test_no_import_runs_back_up_or_across_a_layer(graph: dict[str, set[str]]) -> None:
    wrong = [
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if (a := name.split(".")[0]) != (b := target.split(".")[0]) and LAYER[b] >= LAYER[a]
    ]
    assert wrong == []


def test_no_role_imports_another_role(graph: dict[str, set[str]]) -> None:
    def is_role(name: str) -> bool:
        top = name.split(".")[0]
        return (top in ("producers", "consumers") and name != top) or (
            top == "learners" and name not in LEARNERS_SHARED
        )

    wrong = [f"{name} -> {target}" for name, targets in graph.items() for target in targets if is_role(target)
             and not name.startswith("app.")]  # fmt: skip
    assert wrong == []
    shared = [f"{name} -> {target}" for name in LEARNERS_SHARED for target in graph[name] if is_role(target)]
    assert shared == []


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle a depth-first walk meets (a package's __init__ importing its own submodules is how
    packages re-export, not a circle)."""
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(t for t in graph.get(name, ()) if not t.startswith(name + ".")):
            if state.get(target) == 1:
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def test_the_modules_import_no_circle(graph: dict[str, set[str]]) -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "p": {"p.x"}, "p.x": {"p"}}) == [["a", "b", "c", "a"]]
    assert circles(graph) == []
