"""A generation backend for system benchmarks: it emulates a generation device that answers a whole
batch in `step_s` seconds of wall time without using a CPU (the caller's thread sleeps), so a benchmark
measures the system around generation (bus, actors, rebalances) rather than this machine's cores.

Each answer is `\\boxed{k}` for a uniformly random k among the actions the prompt lists (a random valid
policy; `\\boxed{0}` when it lists none), with real token ids and a logprob of log(1/choices) per token.
`load_weights` checks the folder like a real backend and takes the version.
"""

from __future__ import annotations

import math
import random
import re
import threading
import time
from pathlib import Path
from typing import Any

from infra.models.tokenizer import encode_prompt
from infra.models.types import Completion

LISTED = re.compile(r"^(\d+): ", re.MULTILINE)


class StubBackend:
    def __init__(self, tokenizer: Any, *, step_s: float, seed: int = 0, version: int = 0) -> None:
        self.tokenizer = tokenizer
        self.step_s = step_s
        self.version = version
        self.max_len = 1 << 20
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

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
        rng = random.Random(seed) if seed is not None else self._rng
        time.sleep(self.step_s)  # the device's time for the whole batch; no CPU used here
        out = []
        with self._lock:
            for prompt in prompts:
                prompt_ids = encode_prompt(self.tokenizer, prompt)
                choices = len(LISTED.findall(prompt)) or 1
                group = []
                for _ in range(n):
                    text = f"\\boxed{{{rng.randrange(choices)}}}"
                    ids = list(self.tokenizer.encode(text, add_special_tokens=False))[:max_tokens]
                    group.append(Completion(text=text, token_ids=ids, logprobs=[-math.log(choices)] * len(ids),
                                            prompt_token_ids=prompt_ids, finish_reason="stop",
                                            version=self.version))  # fmt: skip
                out.append(group)
        return out

    def load_weights(self, version: int, path: str | Path) -> None:
        from infra.weights import check_folder

        check_folder(Path(path))
        self.version = version
