"""Load a `RunConfig` from file, then environment, then flags (later sources win).

- file: TOML whose tables mirror `RunConfig` (`[kafka]`, `[policy_learner]`, ...);
- environment: `FORGESTREAM_KAFKA__BOOTSTRAP=host:9092` (section, double underscore, field);
  a value for a text field is taken verbatim (a numeric password stays text, quotes stay); any other
  value is read as a TOML literal when it parses (`3`, `true`, `[0.9, 0.99]`), else as a string;
- flags: a mapping of dotted keys (`{"kafka.bootstrap": "host:9092"}`).
"""

from __future__ import annotations

import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import msgspec

from schemas.config import RunConfig

C = TypeVar("C", bound=msgspec.Struct)
ENV_PREFIX = "FORGESTREAM_"
# FORGESTREAM_* variables that locate things for a process (config file, caches, tools, sandbox mode)
# rather than set a config field. FORGESTREAM_SUPERVISOR: the pid of the `up` a role dies with.
PROCESS_VARIABLES = frozenset(
    {
        "FORGESTREAM_CONFIG",
        "FORGESTREAM_HOME",
        "FORGESTREAM_TANSU",
        "FORGESTREAM_S3RVER",
        "FORGESTREAM_SANDBOX",
        "FORGESTREAM_SUPERVISOR",
    }
)


class ConfigError(ValueError):
    """A config value is missing, mistyped or out of bounds; the message names the field."""


def _parse_scalar(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _field_type(root: type, dotted: str) -> Any:
    """The type of a dotted config field, or None where there is no such field (validation names it)."""
    node: Any = root
    for part in dotted.split("."):
        if not (isinstance(node, type) and issubclass(node, msgspec.Struct)):
            return None
        node = typing.get_type_hints(node).get(part)
    return node


def _is_text(tp: Any) -> bool:
    """str, a Literal of strings, or an optional of those."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return all(isinstance(a, str) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return bool(args) and all(_is_text(a) for a in args)
    return tp is str


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {part} is a value, not a section")
        node = child
    node[leaf] = value


def _env_overrides(environ: Mapping[str, str], config_type: type) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name in PROCESS_VARIABLES:
            continue
        dotted = name.removeprefix(ENV_PREFIX).lower().replace("__", ".")
        _set_dotted(tree, dotted, raw if _is_text(_field_type(config_type, dotted)) else _parse_scalar(raw))
    return tree


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(
    path: str | Path | None = None,
    *,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_type: type[C] = RunConfig,  # type: ignore[assignment]
) -> C:
    """Build a validated config; raises ConfigError naming the offending field."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p}: {e}") from None
    data = _merge(data, _env_overrides(os.environ if environ is None else environ, config_type))
    flag_tree: dict[str, Any] = {}
    for dotted, value in (flags or {}).items():
        if value is not None:
            _set_dotted(flag_tree, dotted, value)
    data = _merge(data, flag_tree)
    try:
        return msgspec.convert(data, config_type, strict=False)
    except msgspec.ValidationError as e:
        raise ConfigError(f"invalid config: {e}") from None
