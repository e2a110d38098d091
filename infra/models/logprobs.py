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
    seqs = [list(p) + list(r) for p, r in zip(prompt_ids, continuations, strict=True)]
    input_ids, attention = padded(seqs, next(model.parameters()).device, left=False)
    return model(input_ids=input_ids, attention_mask=attention).logits, input_ids, attention


def padded(seqs: list[list[int]], device: torch.device, *, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids padded with 0 to the longest, on the left or the right, and their attention mask."""
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
    attention = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
    for i, s in enumerate(seqs):
        at = slice(width - len(s), width) if left else slice(0, len(s))
        ids[i, at] = torch.tensor(s, dtype=torch.long)
        attention[i, at] = 1
    return ids, attention


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


def answer_logprobs(
    model: Any, prompt_ids: list[list[int]], answers: list[list[list[int]]], temperature: float
) -> list[torch.Tensor]:
    """Sequence logprob (summed over its tokens) of each of several answers to each prompt.

    `answers[i]` are prompt i's candidate answers; returns one 1-D tensor [len(answers[i])] per prompt,
    differentiable when grad is on. Each prompt is run once (left-padded, its keys and values cached)
    and only its answers' tokens after it, so K answers cost a prompt and K short continuations
    instead of K prompts.
    """
    if len(prompt_ids) != len(answers):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(answers)} answer lists")
    if any(not p for p in prompt_ids) or any(not a for group in answers for a in group):
        raise ValueError("every prompt and every answer needs at least one token")
    device = next(model.parameters()).device
    ids, attention = padded(prompt_ids, device, left=True)
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    prompt = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True)
    # one row per answer, the cache and the last prompt logits repeated for it
    owner = torch.tensor([i for i, group in enumerate(answers) for _ in group], device=device)
    rows = [a for group in answers for a in group]
    cache = prompt.past_key_values
    cache.batch_select_indices(owner)
    tokens, mask = padded(rows, device, left=False)
    longest = tokens.shape[1]
    logits = prompt.logits[owner, -1:]  # predicts each answer's first token
    if longest > 1:  # the answers' own tokens predict the rest (right padding: nothing real sees a pad)
        lengths = attention.sum(1)[owner]
        after = model(
            input_ids=tokens[:, :-1],
            attention_mask=torch.cat([attention[owner], torch.ones_like(tokens[:, :-1])], 1),
            position_ids=lengths[:, None] + torch.arange(longest - 1, device=device)[None],
            past_key_values=cache,
            use_cache=False,
        )
        logits = torch.cat([logits, after.logits], 1)
    sums = (token_logprobs(logits, tokens, temperature) * mask.float()).sum(1)
    return list(sums.split([len(group) for group in answers]))
