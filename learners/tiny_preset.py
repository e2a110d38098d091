"""The `tiny` model preset: built here from the environments' own data, served by the plumbing.

A Llama config (by default width 128, 4 layers, 4 heads, tied embeddings, ~0.9 M params) with a word-level
tokenizer trained on the environments' text, then bootstrap SFT (learners/bootstrap.py) on oracle
demonstrations (policy: then `bootstrap_dagger_rounds` DAgger rounds on the states it reaches itself)
or on labelled judge prompts (reward: most from the tiny policy preset's own rollouts on training
tasks, see `rollout_policy_config`). Cached by `infra.models.presets.build_once` under a key that
hashes everything the build depends on (architecture, role, seed, SFT steps, the DAgger rounds, a
fingerprint of the training data). Reproducible from the seed on one instruction set of torch's CPU
kernels (the Makefile pins AVX2; `bootstrap.json` records it): the SFT length is a step count derived
from `bootstrap_sft_seconds` with a fixed reference step time, not a wall-clock budget.

Importing this module registers the recipe, so `prepare_preset` (and every loader) knows `tiny`:
the plumbing never imports the environments or the bootstrap itself.

Policy and reward model never share weights: each role gets its own folder.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.models.presets import BUILD_RECIPE, Role, build_once, cache_key, cache_root, register_recipe
from schemas.config import ModelConfig

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


def tiny_arch(model: ModelConfig) -> dict[str, object]:
    """`TINY_ARCH` at `model.tiny_width` and `.tiny_layers` (equal to it at the defaults, so the key holds)."""
    heads = model.tiny_width // 32
    return TINY_ARCH | {"hidden_size": model.tiny_width, "intermediate_size": 3 * model.tiny_width,
                        "num_hidden_layers": model.tiny_layers, "num_attention_heads": heads,
                        "num_key_value_heads": heads}  # fmt: skip


# Seconds one SFT step (batch 32, ~150 tokens) took on this box's reference core at 1 thread.
REFERENCE_STEP_S = 0.6


def sft_steps(model: ModelConfig) -> int:
    return max(1, round(model.bootstrap_sft_seconds / REFERENCE_STEP_S))


def dagger_rounds(model: ModelConfig) -> int:
    """The policy preset's DAgger rounds: the config's, or where it leaves them to the domains, theirs
    (TextWorld 2, one per pool it widens to; household 1)."""
    from learners import bootstrap

    if model.bootstrap_dagger_rounds is not None:
        return model.bootstrap_dagger_rounds
    return bootstrap.dagger_rounds(sorted(set(model.bootstrap_domains)))


def dagger_steps(model: ModelConfig) -> int:
    """SFT steps of each DAgger round of the policy preset (0: no rounds)."""
    if dagger_rounds(model) == 0:
        return 0
    from learners import bootstrap

    return round(sft_steps(model) * bootstrap.DAGGER_STEP_SHARE)


def dagger_episodes(model: ModelConfig) -> int:
    """Training episodes each DAgger round plays (256 for the default's 400 steps)."""
    from learners import bootstrap

    return round(dagger_steps(model) * bootstrap.DAGGER_EPISODES_PER_STEP)


def prepare_tiny(model: ModelConfig, role: Role, workdir: Path) -> Path:
    """The tiny preset's folder for `role` (built and cached on first use)."""
    from learners import bootstrap

    root = cache_root(workdir)
    domains = sorted(set(model.bootstrap_domains))
    # the data's fingerprint, not the envs' source: a prompt-format change rebuilds, a refactor does not
    data = data_fingerprint(domains, root)
    parts = {"preset": "tiny", "role": role, "arch": tiny_arch(model), "seed": model.seed,
             "steps": sft_steps(model), "domains": domains, "data": data, "recipe": BUILD_RECIPE}  # fmt: skip
    if role == "policy" and dagger_steps(model) > 0:
        parts["dagger"] = {"rounds": dagger_rounds(model), "levels": model.bootstrap_dagger_levels,
                           "steps": dagger_steps(model), "episodes": dagger_episodes(model),
                           "own_share": bootstrap.DAGGER_OWN_SHARE, "lr": bootstrap.DAGGER_LR}  # fmt: skip
        if pools := bootstrap.dagger_pools(domains):  # household keeps its cache key
            parts["dagger"]["games"] = pools
    if role == "policy" and model.bootstrap_expert != "omniscient":  # the default keeps its cache key
        parts["expert"] = model.bootstrap_expert
    if model.bootstrap_prompt_loss:
        parts["prompt_loss"] = model.bootstrap_prompt_loss
    # a preset keeps the tokenizer it was trained with: a new corpus, a new preset
    if bootstrap.CORPUS_VERSION != 1:
        parts["corpus"] = bootstrap.CORPUS_VERSION
    rollout_policy = None
    if role == "reward" and getattr(model, "bootstrap_rollouts", 0) > 0:
        rollout_policy = prepare_tiny(rollout_policy_config(model), "policy", workdir)
        parts |= {"rollouts": model.bootstrap_rollouts, "rollout_levels": model.bootstrap_rollout_levels,
                  "rollout_policy": rollout_policy.name, "rollout_draw": bootstrap.ROLLOUT_DRAW}  # fmt: skip
        if (pool := bootstrap.rollout_pool(domains)) is not None:  # household keeps its cache key
            parts["rollout_pool"] = pool
    folder = root / f"tiny-{role}-{cache_key(parts)}"
    # finished stages of an interrupted build of this key: a long build (TextWorld's takes hours) resumes
    stages = folder.with_name(f".stages-{folder.name}")
    build_once(folder, lambda out: _build_tiny(model, role, out, root, rollout_policy, stages))
    shutil.rmtree(stages, ignore_errors=True)
    return folder


def _processor() -> str:
    """The processor's name, family and model, recorded beside the instruction set: two builds of one
    key on one instruction set can still differ between machines, and this tells them apart."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "cpu family", "model") and key.strip() not in fields:
                fields[key.strip()] = value.strip()
    name = fields.get("model name", platform.processor())
    return f"{name} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def data_fingerprint(domains: list[str], root: Path) -> str:
    """`bootstrap.data_fingerprint(domains)`, remembered under `root` for one version of the code that
    makes the data (envs, schemas, the bootstrap) and of the game engines: computing it plays games
    (TextWorld: about a minute) and every role resolves its presets at start. A code change recomputes
    it once; the presets rebuild only if the data itself changed."""
    from learners import bootstrap

    memo = root / "fingerprints" / cache_key({"domains": sorted(domains), "sources": _sources_digest()})
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
    from learners import bootstrap

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


def tiny_tokenizer(domains: list[str], root: Path) -> Path:
    """The word-level tokenizer of `domains`' text, shared by the tiny policy and reward presets."""
    from learners import bootstrap

    key = cache_key({"domains": domains, "data": data_fingerprint(domains, root), "recipe": BUILD_RECIPE,
                     "corpus": bootstrap.CORPUS_VERSION})  # fmt: skip

    def build(out: Path) -> None:
        from infra.models.tokenizer import train_word_tokenizer

        train_word_tokenizer(bootstrap.corpus_texts(domains, seed=0)).save_pretrained(str(out))

    return build_once(root / f"tokenizer-{key}", build)


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


def _build_tiny(model: ModelConfig, role: Role, out: Path, root: Path, rollout_policy: Path | None,
                stages: Path) -> None:  # fmt: skip
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from infra.models.tokenizer import load_tokenizer
    from learners import bootstrap

    domains = sorted(set(model.bootstrap_domains))
    tokenizer = load_tokenizer(tiny_tokenizer(domains, root))
    torch.manual_seed(model.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **tiny_arch(model),
    )
    net = LlamaForCausalLM(config)
    data: dict[str, object] = {}
    resumed: list[str] = []
    if role == "policy":
        bootstrap.prefetch_pools(domains)
        pairs = bootstrap.policy_pairs(domains, seed=model.seed, expert=model.bootstrap_expert)
    else:
        rollouts = None
        if rollout_policy is not None:
            from infra.models.hf_backend import HFBackend

            player = rollout_policy_config(model)
            played = _stage(stages, "rollouts", resumed, lambda: dict(zip(("good", "bad"), bootstrap.rollout_examples(
                HFBackend(rollout_policy), domains, episodes=model.bootstrap_rollouts,
                levels=model.bootstrap_rollout_levels, seed=model.seed,
                temperature=player.temperature, max_tokens=player.max_new_tokens,
            ), strict=True)))  # fmt: skip
            rollouts = (played["good"], played["bad"])
            data = {"rollout_policy": rollout_policy.name, "rollout_episodes": model.bootstrap_rollouts,
                    "rollout_good_steps": len(rollouts[0]), "rollout_bad_steps": len(rollouts[1])}  # fmt: skip
        pairs = bootstrap.reward_pairs(domains, seed=model.seed, rollouts=rollouts)
    report = _stage(stages, "sft", resumed, lambda: bootstrap.sft(net, tokenizer, pairs, steps=sft_steps(model),
                                                                  seed=model.seed,
                                                                  prompt_loss=model.bootstrap_prompt_loss), net)  # fmt: skip
    net.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    if role == "policy" and dagger_steps(model) > 0:
        rounds = []
        for r in range(dagger_rounds(model)):
            rounds.append(_stage(stages, f"dagger-{r}", resumed,
                                 lambda r=r: _dagger_round(net, tokenizer, model, domains, out, r), net))  # fmt: skip
            net.save_pretrained(str(out))  # the next round plays these weights
        data["dagger"] = rounds
    if role == "policy" and model.bootstrap_reading_states > 0:  # measured, not trained: not in the key
        from infra.models.hf_backend import HFBackend

        data["reading"] = bootstrap.reading(HFBackend(out), domains, states=model.bootstrap_reading_states,
                                            levels=model.bootstrap_dagger_levels, max_tokens=model.max_new_tokens)  # fmt: skip
    # the kernels' instruction set decides the float rounding, and so the weights (the Makefile pins it)
    report = {"role": role, "build_id": uuid.uuid4().hex, "vocab": len(tokenizer),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu": _processor(), **report, **data,
              "resumed_stages": resumed}  # fmt: skip
    (out / "bootstrap.json").write_text(json.dumps(report, indent=1))


def _stage(stages: Path, name: str, resumed: list[str], run: Callable[[], dict[str, Any]],
           net: Any = None) -> dict[str, Any]:  # fmt: skip
    """Run one stage of a build and keep what it made (its JSON result and `net`'s weights) under
    `stages`; or, when an interrupted build of the same key finished it, restore that instead (and
    note `name` in `resumed`). Every stage is a pure function of the key and the stages before it
    (seeded play, seeded SFT), so a resumed build ends with the weights an uninterrupted one would."""
    from safetensors.torch import load_model, save_model

    done = stages / name
    if (done / "result.json").is_file():
        if net is not None:
            load_model(net, str(done / "model.safetensors"))
        resumed.append(name)
        return json.loads((done / "result.json").read_text())
    result = run()
    staging = stages / f".tmp-{name}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if net is not None:
        save_model(net, str(staging / "model.safetensors"))
    (staging / "result.json").write_text(json.dumps(result))
    os.replace(staging, done)  # atomic: a stage is kept whole or not at all
    return result


def _dagger_round(net: Any, tokenizer: Any, model: ModelConfig, domains: list[str], out: Path,
                  round_index: int) -> dict[str, object]:  # fmt: skip
    """DAgger round `round_index` on the policy saved in `out`: play, label with the expert, train `net`
    (on the round's pool of games, where a domain's rounds widen it)."""
    from infra.models.hf_backend import HFBackend
    from learners import bootstrap

    seed = model.seed + 1 + round_index
    bootstrap.prefetch_pools(domains, round_index)  # the games it plays and its demonstrations' alike
    own = bootstrap.visited_state_pairs(
        HFBackend(out), domains, episodes=dagger_episodes(model), levels=model.bootstrap_dagger_levels,
        seed=seed, temperature=model.temperature, max_tokens=model.max_new_tokens, expert=model.bootstrap_expert,
        dagger_round=round_index,
    )  # fmt: skip
    if not own:  # no domain with an expert to ask
        return {"states": 0}
    demonstrations = bootstrap.policy_pairs(
        domains, seed=seed, expert=model.bootstrap_expert, dagger_round=round_index
    )
    pairs = bootstrap.mixed_pairs(own, demonstrations, own_share=bootstrap.DAGGER_OWN_SHARE, seed=seed)
    report = bootstrap.sft(
        net,
        tokenizer,
        pairs,
        steps=dagger_steps(model),
        seed=seed,
        lr=bootstrap.DAGGER_LR,
        prompt_loss=model.bootstrap_prompt_loss,
    )
    return {"states": len(own), **report}


register_recipe("tiny", prepare_tiny)
