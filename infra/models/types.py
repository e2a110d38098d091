"""What every generation backend returns and promises: the contract the roles rely on."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec


class Completion(msgspec.Struct):
    """One sampled response: its tokens, their logprobs (LOGPROB CONVENTION) and the weight version."""

    text: str  # decoded response, cut before the first stop string
    token_ids: list[int]  # generated tokens (up to and including the one that completed a stop string)
    logprobs: list[float]  # one per token_ids entry: log_softmax(logits / T) of the sampled token
    prompt_token_ids: list[int]  # what the model was conditioned on (after chat template, with bos)
    finish_reason: str  # "stop" (eos or stop string) or "length"
    version: int  # weight version that produced every token


@runtime_checkable
class GenerationBackend(Protocol):
    version: int
    tokenizer: Any

    def generate(
        self,
        prompts: list[str],
        *,
        n: int = 1,
        temperature: float,
        max_tokens: int,
        stop: list[str] | None = None,
        seed: int | None = None,
    ) -> list[list[Completion]]: ...

    def load_weights(self, version: int, path: str | Path) -> None: ...


def tokens_within(tokenizer: Any, tokens: list[int], chars: int) -> int:
    """How many leading `tokens` decode to at most `chars` characters (at most all but the last).
    A bisection: the actor asks this of every invalid answer, and decoded length grows with k. Special
    tokens count with their text: an unknown word decodes to nothing once skipped, and would then count
    as spelled."""
    low, high = 0, max(len(tokens) - 1, 0)
    while low < high:
        mid = (low + high + 1) // 2
        if len(tokenizer.decode(tokens[:mid], skip_special_tokens=False)) <= chars:
            low = mid
        else:
            high = mid - 1
    return low


def truncate_at_stop(tokenizer: Any, tokens: list[int], stop: list[str]) -> tuple[int, str] | None:
    """(tokens to keep, text before the stop string) for the first stop string written, else None."""
    full = tokenizer.decode(tokens, skip_special_tokens=True)
    if not any(s in full for s in stop):
        return None
    for k in range(1, len(tokens) + 1):
        text = tokenizer.decode(tokens[:k], skip_special_tokens=True)
        hits = [text.find(s) for s in stop if s in text]
        if hits:
            return k, text[: min(hits)]
    return None
