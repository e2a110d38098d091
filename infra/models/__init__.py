"""Model backends, presets and the learner's logprob function (the contract: infra/models/types.py).

    backend = load_backend(config.policy_model, role="policy", workdir=workdir)   # actors / judges
    model, tokenizer = load_trainable(config.policy_model, role="policy", workdir=workdir)  # learners
    logprobs = sequence_logprobs(model, prompt_ids, response_ids, temperature)

Blocking calls: roles run them through `anyio.to_thread.run_sync`. Every loader sets torch's thread
count from the config (1 by default). Importing this package is cheap; torch loads on first use.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.models.presets import Role, prepare_preset
from infra.models.types import Completion, GenerationBackend
from schemas.config import ModelConfig

if TYPE_CHECKING:
    import torch


def _threads(model: ModelConfig) -> None:
    import torch

    torch.set_num_threads(model.torch_threads)


def prepare_run_models(config: Any, workdir: Path) -> dict[str, Path]:
    """Build (or find cached) the policy and reward presets a RunConfig names: role -> HF folder."""
    return {
        "policy": prepare_preset(config.policy_model, role="policy", workdir=Path(workdir)),
        "reward": prepare_preset(config.reward_model, role="reward", workdir=Path(workdir)),
    }


def load_backend(model: ModelConfig, *, role: Role, workdir: Path) -> GenerationBackend:
    """A generation backend serving a fresh copy of the preset's weights, version 0."""
    _threads(model)
    folder = prepare_preset(model, role=role, workdir=Path(workdir))
    if model.backend == "stub":
        from infra.models.stub_backend import StubBackend
        from infra.models.tokenizer import load_tokenizer

        return StubBackend(load_tokenizer(folder), step_s=model.stub_step_s, seed=model.seed)
    if model.backend == "vllm":
        from infra.models.vllm_backend import VLLMBackend

        return VLLMBackend(folder, dtype=model.dtype, seed=model.seed, device=model.device)
    from infra.models.hf_backend import HFBackend

    return HFBackend(folder, dtype=model.dtype, device=model.device)


def load_trainable(model: ModelConfig, *, role: Role, workdir: Path) -> tuple[Any, Any]:
    """(PreTrainedModel in train mode, tokenizer) for a learner; its own copy of the preset's weights."""
    _threads(model)
    import torch
    from transformers import AutoModelForCausalLM

    from infra.models.hf_backend import DTYPES
    from infra.models.tokenizer import load_tokenizer

    folder = prepare_preset(model, role=role, workdir=Path(workdir))
    net = AutoModelForCausalLM.from_pretrained(str(folder), dtype=DTYPES[model.dtype])
    net.to(torch.device(model.device)).train()
    return net, load_tokenizer(folder)


def sequence_logprobs(
    model: Any, prompt_ids: list[list[int]], response_ids: list[list[int]], temperature: float
) -> list[torch.Tensor]:
    """Per-token logprobs of each response under the LOGPROB CONVENTION (see infra/models/logprobs.py)."""
    from infra.models.logprobs import sequence_logprobs as impl

    return impl(model, prompt_ids, response_ids, temperature)


def next_token_logprobs(
    model: Any, prompt_ids: list[list[int]], prefixes: list[list[int]], temperature: float
) -> torch.Tensor:
    """Next-token log-probabilities [B, V] after each prompt + answer prefix (infra/models/logprobs.py)."""
    from infra.models.logprobs import next_token_logprobs as impl

    return impl(model, prompt_ids, prefixes, temperature)


def answer_logprobs(
    model: Any, prompt_ids: list[list[int]], answers: list[list[list[int]]], temperature: float
) -> list[torch.Tensor]:
    """Summed logprob of each of several answers per prompt, each prompt run once (infra/models/logprobs.py)."""
    from infra.models.logprobs import answer_logprobs as impl

    return impl(model, prompt_ids, answers, temperature)


__all__ = [
    "Completion",
    "GenerationBackend",
    "answer_logprobs",
    "load_backend",
    "load_trainable",
    "next_token_logprobs",
    "prepare_preset",
    "prepare_run_models",
    "sequence_logprobs",
]
