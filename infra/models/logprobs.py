"""Per-token logprobs under the project's LOGPROB CONVENTION.

A token's logprob is `log_softmax(logits / T)` at that token, T the sampling temperature; greedy
decoding (T = 0) counts as T = 1. Backends stamp generated tokens with it (behaviour logprobs) and
learners recompute it with `sequence_logprobs` (proximal / current logprobs), so the two agree for
the same weights up to float error.
"""

from __future__ import annotations

from typing import Any

import torch


def effective_temperature(temperature: float) -> float:
    """The temperature logprobs are taken at: greedy (0) means 1."""
    return temperature if temperature > 0 else 1.0


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) gathered at `tokens`; logits [..., V], tokens [...] -> [...] (float32)."""
    scaled = logits.float() / effective_temperature(temperature)
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _right_padded_forward(
    model: Any, prompt_ids: list[list[int]], continuations: list[list[int]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward over each prompt + continuation, right-padded with 0: (logits, input ids, mask)."""
    device = next(model.parameters()).device
    seqs = [list(p) + list(r) for p, r in zip(prompt_ids, continuations, strict=True)]
    width = max(len(s) for s in seqs)
    input_ids = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
    attention = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
    for i, s in enumerate(seqs):
        input_ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        attention[i, : len(s)] = 1
    return model(input_ids=input_ids, attention_mask=attention).logits, input_ids, attention


def sequence_logprobs(
    model: Any, prompt_ids: list[list[int]], response_ids: list[list[int]], temperature: float
) -> list[torch.Tensor]:
    """Logprob of every response token given its prompt and the response tokens before it.

    One batched forward pass (right padding); returns one 1-D float32 tensor per sample, of length
    len(response_ids[i]), differentiable with respect to the model's parameters when grad is on.
    """
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    if not prompt_ids:
        return []
    logits, input_ids, _ = _right_padded_forward(model, prompt_ids, response_ids)
    device = logits.device
    out: list[torch.Tensor] = []
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        start, end = len(p), len(p) + len(r)
        if not r:
            out.append(torch.zeros(0, dtype=torch.float32, device=device))
            continue
        if start == 0:
            raise ValueError("a response needs at least one prompt token to condition on")
        # logits at position t predict token t + 1
        out.append(token_logprobs(logits[i, start - 1 : end - 1], input_ids[i, start:end], temperature))
    return out


def next_token_logprobs(
    model: Any, prompt_ids: list[list[int]], prefixes: list[list[int]], temperature: float
) -> torch.Tensor:
    """Log-probabilities [B, V] of every next token after each prompt followed by its (possibly empty)
    answer prefix, at temperature T; differentiable when grad is on. One batched forward (right
    padding)."""
    if len(prompt_ids) != len(prefixes):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(prefixes)} prefixes")
    if any(not p for p in prompt_ids):
        raise ValueError("every prompt needs at least one token")
    logits, _, attention = _right_padded_forward(model, prompt_ids, prefixes)
    last = logits[torch.arange(len(prompt_ids), device=logits.device), attention.sum(1) - 1]
    return torch.log_softmax(last.float() / effective_temperature(temperature), dim=-1)
