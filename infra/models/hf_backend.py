"""transformers generation backend: batched sampling with a KV cache, left padding, stop strings.

Every generated token carries its logprob under the LOGPROB CONVENTION (infra/models/logprobs.py)
and every completion the weight version that produced it. `load_weights` swaps weights in place
from a verified safetensors folder; a file that does not fit the model is refused before any
parameter changes, so the backend keeps serving its current version.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from infra.models.logprobs import effective_temperature, token_logprobs
from infra.models.tokenizer import encode_prompt, load_tokenizer
from infra.models.types import Completion, truncate_at_stop

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFBackend:
    """GenerationBackend on transformers (CPU here, CUDA when `device` says so)."""

    def __init__(self, folder: str | Path, *, dtype: str = "float32", device: str = "cpu", version: int = 0):
        from transformers import AutoModelForCausalLM

        self.folder = Path(folder)
        self.device = torch.device(device)
        self.dtype = DTYPES[dtype]
        self.tokenizer = load_tokenizer(self.folder)
        self.model = AutoModelForCausalLM.from_pretrained(str(self.folder), dtype=self.dtype)
        self.model.to(self.device).eval()
        self.version = version
        self.max_len = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self._lock = threading.Lock()  # generate and load_weights never interleave

    # --- weights ---
    def load_weights(self, version: int, path: str | Path) -> None:
        from infra.weights import read_safetensors_checked

        tensors = read_safetensors_checked(Path(path))
        own = self.model.state_dict()
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        missing = [k for k in own if k not in tensors and not (tied and k == "lm_head.weight")]
        unexpected = [k for k in tensors if k not in own]
        bad_shape = [k for k, t in tensors.items() if k in own and tuple(t.shape) != tuple(own[k].shape)]
        if missing or unexpected or bad_shape:
            from infra.weights import WeightsRejected

            raise WeightsRejected(
                f"{path}: weights do not fit this model (missing {missing[:3]}, unexpected "
                f"{unexpected[:3]}, wrong shape {bad_shape[:3]}); keeping version {self.version}"
            )
        with self._lock, torch.no_grad():
            for name, tensor in tensors.items():
                own[name].copy_(tensor.to(own[name].dtype))
            if tied:
                self.model.tie_weights()
            self.version = version

    # --- generation ---
    @torch.no_grad()
    def generate(
        self,
        prompts: list[str],
        *,
        n: int = 1,
        temperature: float,
        max_tokens: int,
        stop: list[str] | None = None,
        seed: int | None = None,
    ) -> list[list[Completion]]:
        if not prompts:
            return []
        with self._lock:
            prompt_ids = [self._fit_prompt(encode_prompt(self.tokenizer, p), max_tokens) for p in prompts]
            generator = None
            if seed is not None:
                generator = torch.Generator(device=self.device).manual_seed(seed)
            tokens, logprobs, finished = self._sample(prompt_ids, n, temperature, max_tokens, generator, stop)
            version = self.version
        out: list[list[Completion]] = []
        for i, ids in enumerate(prompt_ids):
            group = []
            for j in range(n):
                r = i * n + j
                group.append(self._completion(ids, tokens[r], logprobs[r], finished[r], stop, version))
            out.append(group)
        return out

    def _fit_prompt(self, ids: list[int], max_tokens: int) -> list[int]:
        """Keep the end of an over-long prompt (the instructions are last), and its first token (bos)."""
        room = self.max_len - max_tokens
        if len(ids) <= room:
            return ids
        return ids[:1] + ids[len(ids) - room + 1 :]

    def _sample(
        self,
        prompts: list[list[int]],
        n: int,
        temperature: float,
        max_tokens: int,
        generator: torch.Generator | None,
        stop: list[str] | None,
    ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """Sample n completions of each prompt, up to max_tokens each; returns tokens, logprobs and
        whether each row hit eos, rows ordered prompt-major (row i * n + j). Each prompt is prefilled
        once and its KV cache copied n times (a judge's m verdicts share one prompt)."""
        from transformers import DynamicCache

        batch, width = len(prompts), max(len(r) for r in prompts)
        pad_id = self.tokenizer.pad_token_id
        eos_id = self.tokenizer.eos_token_id
        input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for i, r in enumerate(prompts):  # left padding: every row's last prompt token is in the last column
            input_ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            attention[i, width - len(r) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        # logits of the last prompt position only: the others are never sampled from, and on a real
        # vocabulary they cost (SmolLM2, 16 prompts of 430 tokens: 1.35 GB, prefill 45 s -> 32 s)
        logits = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                            past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]  # fmt: skip
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            attention, positions = (
                attention.repeat_interleave(n, dim=0),
                positions.repeat_interleave(n, dim=0),
            )
            batch *= n
        done = torch.zeros(batch, dtype=torch.bool, device=self.device)
        hit_eos = torch.zeros(batch, dtype=torch.bool, device=self.device)
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        step_pos = positions
        for t in range(max_tokens):
            if temperature > 0:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            else:
                nxt = logits.argmax(dim=-1)
            lp = token_logprobs(logits, nxt, effective_temperature(temperature))
            for i in (~done).nonzero().flatten().tolist():
                tokens[i].append(int(nxt[i]))
                logprobs[i].append(float(lp[i]))
            hit_eos |= (nxt == eos_id) & ~done
            done |= nxt == eos_id
            if stop:  # a row that wrote a stop string needs no more tokens
                for i in (~done).nonzero().flatten().tolist():
                    text = self.tokenizer.decode(tokens[i], skip_special_tokens=True)
                    done[i] = any(s in text for s in stop)
            if bool(done.all()) or t == max_tokens - 1:
                break
            step_pos = step_pos[:, -1:] + 1
            attention = torch.cat(
                [attention, torch.ones((batch, 1), dtype=attention.dtype, device=self.device)], -1
            )
            logits = self.model(
                input_ids=nxt.unsqueeze(-1),
                attention_mask=attention,
                position_ids=step_pos,
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1, :]
        return tokens, logprobs, hit_eos.tolist()

    def _completion(
        self,
        prompt_ids: list[int],
        tokens: list[int],
        logprobs: list[float],
        hit_eos: bool,
        stop: list[str] | None,
        version: int,
    ) -> Completion:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        finish = "stop" if hit_eos else "length"
        if stop:
            cut = truncate_at_stop(self.tokenizer, tokens, stop)
            if cut is not None:
                keep, text = cut
                tokens, logprobs, finish = tokens[:keep], logprobs[:keep], "stop"
        return Completion(
            text=text,
            token_ids=tokens,
            logprobs=logprobs,
            prompt_token_ids=prompt_ids,
            finish_reason=finish,
            version=version,
        )
