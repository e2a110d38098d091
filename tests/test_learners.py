"""Learner tests: packing, golden loss, gradient direction, checkpoint round trips, LoRA, and the
policy learner role against the real broker (stale drops; kill -9 between checkpoints, restart).

Models are tiny random Llamas built here (hidden 64, 2 layers); nothing is downloaded.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
import torch

from learners import checkpoint as ckpt
from learners.checkpoint import LearnerState, TrainSample
from learners.core import Trainer, pack_micro_batches, to_train_samples, warmup_lr, whole_groups
from learners.engine import TorchEngine
from schemas.config import LearnerConfig, PolicyLearnerConfig
from tests.conftest import eventually

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
VOCAB = 96


def tiny_llama(seed: int = 0, vocab: int = VOCAB) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).float()
    model.eval()
    return model


def fixed_batch(
    n: int = 6, seed: int = 1, advantage: float | None = None, version: int = 0
) -> list[TrainSample]:
    """Samples with varied lengths; behaviour logprobs near the tiny model's (uniform-ish) values."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p_len = 3 + int(torch.randint(0, 6, (1,), generator=g))
        r_len = 2 + int(torch.randint(0, 5, (1,), generator=g))
        out.append(
            TrainSample(
                key=f"req{seed}/{i}/0",
                prompt_ids=torch.randint(3, VOCAB, (p_len,), generator=g).tolist(),
                response_ids=torch.randint(3, VOCAB, (r_len,), generator=g).tolist(),
                behaviour_logprobs=[-4.5] * r_len,
                version=version,
                advantage=advantage if advantage is not None else (1.0 if i % 2 == 0 else -1.0),
            )
        )
    return out


def learner_config(**overrides) -> LearnerConfig:
    base = dict(lr=1e-2, micro_batch_tokens=40, batch_samples=6, kl_coef=0.01, clip=0.2, is_cap=2.0)
    return LearnerConfig(**{**base, **overrides})


# --- pure pieces ---
def test_pack_micro_batches_by_token_budget() -> None:
    # lengths 10, 4, 7, 3 with budget 20: longest first -> [10] then 10+7? 2*10=20 fits -> [0, 2];
    # next 4: 3*10=30 > 20 -> new group [1]; 3: 2*4=8 fits -> [1, 3]
    assert pack_micro_batches([10, 4, 7, 3], 20) == [[0, 2], [1, 3]]
    # a sample longer than the budget is alone
    assert pack_micro_batches([50, 5], 20) == [[0], [1]]
    assert pack_micro_batches([], 10) == []


def test_warmup_lr_rises_linearly_then_holds() -> None:
    assert [warmup_lr(1e-3, step, 4) for step in range(6)] == pytest.approx(
        [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3]
    )
    assert warmup_lr(1e-3, 0, 0) == 1e-3


def test_samples_the_model_cannot_take_are_dropped_and_counted() -> None:
    import msgspec

    batch = sample_batch("a", 3)
    vocab = 1 + max(max(s.prompt_token_ids + s.response_token_ids) for s in batch.samples)
    bad = msgspec.structs.replace(
        batch.samples[1], response_token_ids=[vocab] * len(batch.samples[1].response_token_ids)
    )
    empty = msgspec.structs.replace(batch.samples[2], prompt_token_ids=[])
    mixed = msgspec.structs.replace(batch, samples=[batch.samples[0], bad, empty])
    samples, invalid = to_train_samples(mixed, "policy_version", vocab_size=vocab)
    assert [s.key for s in samples] == ["a/0/0"] and invalid == 2
    late = msgspec.structs.replace(batch.samples[0], advantage_from=len(batch.samples[0].response_token_ids))
    kept = msgspec.structs.replace(batch.samples[1], advantage_from=1)
    samples, invalid = to_train_samples(
        msgspec.structs.replace(batch, samples=[late, kept]), "policy_version", vocab
    )
    assert [(s.key, s.advantage_from) for s in samples] == [
        ("a/1/0", 1)
    ] and invalid == 1  # no token left: dropped
    assert len(to_train_samples(batch, "policy_version", vocab_size=vocab)[0]) == 3
    listed = msgspec.structs.replace(batch.samples[0], unlisted_at=0, listed_tokens=[3, 4])
    unknown = msgspec.structs.replace(batch.samples[1], listed_tokens=[3, vocab])
    beyond = msgspec.structs.replace(batch.samples[2], unlisted_at=9, listed_tokens=[3])
    samples, invalid = to_train_samples(
        msgspec.structs.replace(batch, samples=[listed, unknown, beyond]), "policy_version", vocab
    )
    assert [(s.key, s.unlisted_at, s.listed_tokens) for s in samples] == [
        ("a/0/0", 0, [3, 4])
    ] and invalid == 2
    answers = msgspec.structs.replace(batch.samples[0], listed_answers=[[3, 2], [4, 5, 2]])
    unknown = msgspec.structs.replace(batch.samples[1], listed_answers=[[3, 2], [vocab, 2]])
    samples, invalid = to_train_samples(
        msgspec.structs.replace(batch, samples=[answers, unknown]), "policy_version", vocab
    )
    assert [(s.key, s.listed_answers) for s in samples] == [("a/0/0", [[3, 2], [4, 5, 2]])] and invalid == 1


def test_tokens_before_advantage_from_carry_no_loss() -> None:
    """Masked tokens drop out of the loss: their behaviour logprobs (and so their importance weights)
    change nothing once `advantage_from` passes them, and change the loss when it does not."""
    import msgspec

    base = fixed_batch(n=1, advantage=-1.0)[0]
    r = len(base.response_ids)
    other = msgspec.structs.replace(base, behaviour_logprobs=[-0.1] * (r - 1) + [-4.5])
    cfg = learner_config()

    def first_loss(sample: TrainSample) -> float:
        return run_steps(tiny_llama(0), [sample], 1, cfg)[0]

    masked = [msgspec.structs.replace(s, advantage_from=r - 1) for s in (base, other)]
    assert first_loss(masked[0]) == pytest.approx(first_loss(masked[1]), abs=1e-7)
    assert abs(first_loss(base) - first_loss(other)) > 1e-3


def test_whole_groups_fill_a_batch_without_splitting_a_group() -> None:
    def sample(group: str, i: int) -> TrainSample:
        return TrainSample(key=f"{group}/{i}", prompt_ids=[1], response_ids=[2], behaviour_logprobs=[-1.0],
                           version=0, advantage=1.0, group=group)  # fmt: skip

    pending = [sample("a", 0), sample("a", 1), sample("b", 0), sample("a", 2), sample("c", 0), sample("c", 1)]
    # at least 3: group a (3 samples, one arrived late) is enough
    assert [s.key for s in whole_groups(pending, 3)] == ["a/0", "a/1", "a/2"]
    # at least 4: a and b whole, c left for the next batch
    assert [s.key for s in whole_groups(pending, 4)] == ["a/0", "a/1", "a/2", "b/0"]
    assert len(whole_groups(pending, 100)) == 6


def run_steps(
    engine_model: torch.nn.Module, batch: list[TrainSample], steps: int, cfg: LearnerConfig
) -> list[float]:
    trainer = Trainer(TorchEngine(engine_model, cfg), cfg, temperature=0.8)
    return [trainer.step(batch).loss for _ in range(steps)]


def test_golden_loss_fixed_seed() -> None:
    """Fixed seed, fixed batch, plain torch AdamW: the loss sequence is pinned (regression guard)."""
    losses = run_steps(tiny_llama(0), fixed_batch(), 4, learner_config())
    print("golden losses", losses)
    assert losses == pytest.approx(GOLDEN_LOSSES, abs=1e-5)


GOLDEN_LOSSES = [0.03822994728883107, -0.6141162166992823, -0.8207672561208407, -0.8977497244874637]


def response_logprobs(model: torch.nn.Module, batch: list[TrainSample]) -> list[torch.Tensor]:
    from infra.models import sequence_logprobs

    with torch.no_grad():
        return sequence_logprobs(model, [s.prompt_ids for s in batch], [s.response_ids for s in batch], 0.8)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_advantage_sign_moves_logprobs(sign: float) -> None:
    """Positive advantages raise the trained tokens' logprobs; negative ones lower them."""
    model = tiny_llama(0)
    batch = fixed_batch(advantage=sign)
    before = torch.cat(response_logprobs(model, batch))
    run_steps(model, batch, 3, learner_config(lr=3e-3))
    after = torch.cat(response_logprobs(model, batch))
    change = (after - before) * sign
    assert change.mean() > 0.05, change
    assert (change > 0).float().mean() > 0.9, change


def test_minibatches_make_the_clip_act() -> None:
    """With two optimizer steps per batch, the second step sees ratio != 1 against the proximal policy."""
    model = tiny_llama(0)
    cfg = learner_config(lr=5e-2, clip=0.05)
    trainer = Trainer(TorchEngine(model, cfg), cfg, temperature=0.8)
    batch = fixed_batch()
    prox = trainer.proximal(batch)
    first = trainer.step(batch[:3], prox[:3])
    second = trainer.step(batch[3:] + batch[:3], prox[3:] + prox[:3])
    assert first.clip_fraction == 0.0 and first.kl == pytest.approx(0.0, abs=1e-7)
    assert second.clip_fraction > 0.0 and second.kl > 0.0


def test_reference_kl_holds_the_start_weights() -> None:
    """With a reference (the start weights) the KL to it is 0 before any update and grows after, and
    the same updates move the logprobs less than without it."""
    batch = fixed_batch()
    moved = {}
    for coef in (0.0, 5.0):
        model, reference = tiny_llama(0), tiny_llama(0).eval().requires_grad_(False)
        cfg = learner_config(lr=3e-3, minibatches=2, ref_kl_coef=coef)
        trainer = Trainer(TorchEngine(model, cfg), cfg, 0.8, reference)
        before = torch.cat(response_logprobs(model, batch))
        stats = [s for _ in range(3) for _, _, s in trainer.batch_steps(batch, first_step=0)]
        if coef:
            assert stats[0].ref_kl == pytest.approx(0.0, abs=1e-7) and stats[-1].ref_kl > 1e-4
        else:
            assert trainer.reference is None and all(s.ref_kl == 0.0 for s in stats)
        moved[coef] = float((torch.cat(response_logprobs(model, batch)) - before).abs().mean())
    assert moved[5.0] < moved[0.0], moved
    with pytest.raises(ValueError, match="ref_kl_coef"):  # a coefficient without weights is a config error
        Trainer(
            TorchEngine(tiny_llama(0), learner_config(ref_kl_coef=0.1)), learner_config(ref_kl_coef=0.1), 0.8
        )


def test_listed_token_loss_raises_the_tokens_that_stay_listed() -> None:
    """With listed_token_coef > 0 (and zero advantages, so the policy loss moves nothing) the allowed
    tokens' probability where each answer left the list grows, and the step reports it as it was before;
    at 0 nothing moves. (That the allowed tokens keep
    their ratio holds at the softmax: test_listed_token_loss_hand_computed.)"""
    from msgspec.structs import replace

    from infra.models import next_token_logprobs

    batch = [
        replace(s, unlisted_at=1, listed_tokens=[5 + i, 40 + i])
        for i, s in enumerate(fixed_batch(advantage=0.0))
    ]

    def allowed_logprobs(model: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            rows = next_token_logprobs(
                model, [s.prompt_ids for s in batch], [s.response_ids[:1] for s in batch], 0.8
            )
        return torch.stack([row[s.listed_tokens] for row, s in zip(rows, batch, strict=True)])

    for coef in (0.0, 1.0):
        model = tiny_llama(0)
        cfg = PolicyLearnerConfig(lr=3e-3, micro_batch_tokens=40, batch_samples=6, ref_kl_coef=0.0,
                                  listed_token_coef=coef)  # fmt: skip
        trainer = Trainer(TorchEngine(model, cfg), cfg, temperature=0.8)
        before = allowed_logprobs(model)
        stats = [trainer.step(batch) for _ in range(3)]
        after = allowed_logprobs(model)
        if not coef:
            assert torch.equal(before, after) and all(s.listed_token_mass == 0.0 for s in stats)
            continue
        assert stats[0].listed_token_mass == pytest.approx(float(before.exp().sum(1).mean()), rel=1e-4)
        rise = after.exp().sum(1) / before.exp().sum(1)
        assert (rise > 1.5).all(), rise


def test_listed_conditional_term_cancels_when_the_played_answer_is_all_that_is_listed() -> None:
    """A played answer that is its state's only listed answer has probability 1 under the policy
    conditioned on naming a listed action: with the term on (on-policy, no KL) the step's gradient is
    zero, where without it the advantage moves the weights. With a second listed answer the term
    trains, and the step reports the listed mass as it was before."""
    from msgspec.structs import replace

    from infra.models import answer_logprobs, sequence_logprobs

    model = tiny_llama(0)
    batch = fixed_batch()
    with torch.no_grad():  # behaviour = current: importance weight 1, ratio 1
        own = sequence_logprobs(model, [s.prompt_ids for s in batch], [s.response_ids for s in batch], 0.8)
    batch = [
        replace(s, behaviour_logprobs=lp.tolist(), listed_answers=[s.response_ids])
        for s, lp in zip(batch, own, strict=True)
    ]
    norms = {}
    for on in (False, True):
        cfg = PolicyLearnerConfig(lr=1e-3, micro_batch_tokens=40, batch_samples=6, kl_coef=0.0, ref_kl_coef=0.0,
                                  listed_conditional=on)  # fmt: skip
        norms[on] = Trainer(TorchEngine(tiny_llama(0), cfg), cfg, temperature=0.8).step(batch).grad_norm
    assert norms[False] > 1e-3 and norms[True] < 1e-5 * norms[False], norms

    two = [replace(s, listed_answers=[s.response_ids, [7 + i, 2]]) for i, s in enumerate(batch)]
    with torch.no_grad():
        masses = [float(lp.exp().sum()) for lp in answer_logprobs(model, [s.prompt_ids for s in two],
                                                                 [s.listed_answers for s in two], 0.8)]  # fmt: skip
    cfg = PolicyLearnerConfig(lr=1e-3, micro_batch_tokens=40, batch_samples=6, kl_coef=0.0, ref_kl_coef=0.0,
                              listed_conditional=True)  # fmt: skip
    stats = Trainer(TorchEngine(tiny_llama(0), cfg), cfg, temperature=0.8).step(two)
    assert stats.listed_mass == pytest.approx(sum(masses) / len(masses), rel=1e-4)
    assert stats.grad_norm > 1e-3


def test_checkpoint_round_trip_continues_identically(tmp_path: Path) -> None:
    """Model + optimizer restored from safetensors: the next step equals the uninterrupted run's."""
    cfg, batch = learner_config(), fixed_batch()
    straight = tiny_llama(0)
    run_steps(straight, batch, 3, cfg)

    model = tiny_llama(0)
    engine = TorchEngine(model, cfg)
    trainer = Trainer(engine, cfg, 0.8)
    trainer.step(batch)
    trainer.step(batch)
    tensors, step = engine.optimizer_state()
    pending = batch[:2]
    state = LearnerState(
        version=2, optimizer_step=step, offsets={"forge.samples.policy:3": 17}, pending=pending
    )
    ckpt.save_checkpoint(tmp_path, state, model, tensors)
    (tmp_path / ".tmp-step-00000099-1").mkdir()  # an interrupted write: ignored and cleaned up
    (tmp_path / "step-00000050").mkdir()  # no COMPLETE marker: never restored

    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "step-00000002"
    ckpt.remove_leftovers(tmp_path)
    assert not (tmp_path / ".tmp-step-00000099-1").exists()
    restored_state = ckpt.load_state(latest)
    assert restored_state.version == 2 and restored_state.pending == pending
    assert ckpt.offsets_from_state(restored_state.offsets) == {("forge.samples.policy", 3): 17}
    fresh = tiny_llama(seed=5)  # different init: everything must come from the checkpoint
    ckpt.load_model_weights(latest, fresh)
    engine2 = TorchEngine(fresh, cfg)
    engine2.load_optimizer_state(ckpt.load_optimizer_tensors(latest), restored_state.optimizer_step)
    Trainer(engine2, cfg, 0.8).step(batch)
    for (name, a), b in zip(straight.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_lora_trains_adapters_and_publishes_merged(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from learners.core import apply_lora

    cfg = learner_config(lora_rank=4, lr=1e-2)
    model = apply_lora(tiny_llama(0), 4)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainer = Trainer(TorchEngine(model, cfg), cfg, 0.8)
    batch = fixed_batch(advantage=1.0)
    before = torch.cat(response_logprobs(model, batch))
    for _ in range(3):
        trainer.step(batch)
    after = torch.cat(response_logprobs(model, batch))
    assert (after - before).mean() > 0.01
    assert all(torch.equal(p, base_before[n]) for n, p in model.named_parameters() if not p.requires_grad)
    import copy

    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(tmp_path / "m")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    assert torch.allclose(torch.cat(response_logprobs(loaded, batch)), after, atol=1e-5)


def test_journal_lineage_cuts_undone_steps(tmp_path: Path) -> None:
    for step, keys in [(1, ["a"]), (2, ["b"]), (3, ["c"])]:
        ckpt.append_journal(tmp_path, {"step": step, "version": step, "keys": keys})
    with open(tmp_path / "journal.jsonl", "a") as f:
        f.write('{"step": 4, "ver')  # torn by kill -9
    ckpt.append_journal(tmp_path, {"restored_step": 2})
    ckpt.append_journal(tmp_path, {"step": 3, "version": 3, "keys": ["c2"]})
    assert [e["keys"] for e in ckpt.read_lineage(tmp_path)] == [["a"], ["b"], ["c2"]]


def test_the_journal_rotates_so_disk_stays_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ckpt, "JOURNAL_SEGMENT_BYTES", 300)
    for step in range(1, 41):
        ckpt.append_journal(tmp_path, {"step": step, "version": step, "keys": [f"k{step}"]})
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["journal.1.jsonl", "journal.jsonl"]
    assert all(p.stat().st_size < 300 + 60 for p in tmp_path.iterdir())
    steps = [e["step"] for e in ckpt.read_lineage(tmp_path)]
    assert (
        steps[-1] == 40 and steps == list(range(steps[0], 41)) and 5 < len(steps) < 20
    )  # the newest, in order
    ckpt.append_journal(tmp_path, {"restored_step": steps[1]})  # a restore reaching into the older segment
    assert [e["step"] for e in ckpt.read_lineage(tmp_path)] == steps[:2]


def test_a_crash_right_after_a_checkpoint_keeps_its_step_in_the_lineage(tmp_path: Path) -> None:
    """The journal line goes before the checkpoint: a kill between the checkpoint and the publish
    (here, the publish fails) must not leave a restored step whose keys the lineage lacks."""
    from learners import policy
    from learners.core import Learner
    from schemas.config import KafkaConfig

    config = role_config(tmp_path, KafkaConfig())
    learner = Learner(config, policy.spec(config))
    learner.pending = fixed_batch(4)

    def crash() -> None:
        raise RuntimeError("killed before the publish")

    learner._publish = crash
    with pytest.raises(RuntimeError, match="killed"):
        learner._train_batch()
    root = Path(config.workdir) / "checkpoints" / "policy"
    assert ckpt.latest_checkpoint(root).name == "step-00000001"
    assert sorted(lineage_keys(root)) == sorted(s.key for s in fixed_batch(4))


def test_a_checkpoint_from_before_groups_were_counted_stays_unknown(tmp_path: Path) -> None:
    """A checkpoint written before the learner counted the groups it consumed (its state has no
    `groups_consumed`) restores as unknown, stays unknown through training, and its versions say so (the
    scheduler then gates on running requests only), rather than counting from 0 against a scheduler
    that saw every group settle."""
    from learners import policy
    from learners.core import Learner
    from schemas.config import KafkaConfig

    config = role_config(tmp_path, KafkaConfig())
    learner = Learner(config, policy.spec(config))
    learner.pending = fixed_batch(4)
    (first,) = [s for s in learner._train_batch() if s.published is not None]
    assert first.published.groups_consumed == 4  # counted from 0: four samples without a group, four groups
    latest = ckpt.latest_checkpoint(Path(config.workdir) / "checkpoints" / "policy")
    state = json.loads((latest / "state.json").read_bytes())
    del state["groups_consumed"]  # as an older learner wrote it
    (latest / "state.json").write_text(json.dumps(state))

    restored = Learner(config, policy.spec(config))
    assert restored.state.version == 1 and restored.state.groups_consumed is None
    restored.pending = fixed_batch(4)
    (second,) = [s for s in restored._train_batch() if s.published is not None]
    assert second.published.version == 2 and second.published.groups_consumed is None


# --- the policy learner role against the real broker ---
def tiny_model_dir(root: Path) -> Path:
    from infra.models.tokenizer import train_word_tokenizer

    folder = root / "tiny-llama"
    tiny_llama(0).save_pretrained(folder)
    train_word_tokenizer(["pick up the apple", "go to the kitchen"], min_frequency=1).save_pretrained(folder)
    return folder


# the role tests' learner: one optimizer step per batch unless a test asks for more (the plumbing
# tests count steps), no reference KL
ROLE_LEARNER = dict(
    lr=1e-2,
    batch_samples=4,
    micro_batch_tokens=64,
    poll_timeout_s=0.3,
    minibatches=1,
    epochs=1,
    warmup_steps=0,
    batch_wait_s=0.0,
    ref_kl_coef=0.0,
)


def role_config(tmp_path: Path, kafka_config, eta: int = 2, **learner):
    from schemas.config import ModelConfig, OffPolicyConfig, RunConfig

    return RunConfig(
        workdir=str(tmp_path / "work"),
        kafka=kafka_config,
        policy_model=ModelConfig(preset=f"hf:{tiny_model_dir(tmp_path)}", temperature=0.8),
        policy_learner=PolicyLearnerConfig(**{**ROLE_LEARNER, **learner}),
        off_policy=OffPolicyConfig(eta=eta),
    )


def sample_batch(request_id: str, n: int, version: int = 0, keys: list[str] | None = None):
    from schemas.events import PolicySample, PolicySampleBatch

    samples = []
    for i, s in enumerate(fixed_batch(n, seed=abs(hash(request_id)) % 1000, version=version)):
        samples.append(
            PolicySample(
                sample_key=keys[i] if keys else f"{request_id}/{i}/0",
                task_id="t0",
                prompt_token_ids=s.prompt_ids,
                response_token_ids=s.response_ids,
                behaviour_logprobs=s.behaviour_logprobs,
                policy_version=version,
                advantage=s.advantage,
                reward=s.advantage,
            )
        )
    return PolicySampleBatch(request_id=request_id, samples=samples)


async def send_batches(kafka_config, batches) -> None:
    from infra.bus import Bus
    from schemas import topics

    async with Bus(kafka_config, role="test") as bus:
        for b in batches:
            await bus.send(topics.SAMPLES_POLICY, b, key=b.request_id)


async def wait_for_version(kafka_config, version: int, timeout_s: float) -> None:
    from schemas import topics

    async def published() -> bool:
        return any(w.version >= version for w in await read_values(kafka_config, topics.WEIGHTS))

    await eventually(published, timeout_s, f"version {version} on forge.weights")


def lineage_keys(root: Path) -> list[str]:
    return [k for e in ckpt.read_lineage(root) for k in e["keys"]]


async def read_values(kafka_config, topic: str):
    from infra.bus import Bus

    async with Bus(kafka_config, role="test") as bus:
        return [r.value for r in await bus.read_topic(topic, latest_per_key=False)]


async def test_role_drops_stale_and_duplicates_and_publishes(tmp_path: Path, kafka_config) -> None:
    from transformers import AutoModelForCausalLM

    from learners import policy
    from schemas import topics

    config = role_config(tmp_path, kafka_config, eta=0)
    root = Path(config.workdir) / "checkpoints" / "policy"
    shutdown = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: policy.run(config, shutdown=shutdown))
        await send_batches(kafka_config, [sample_batch("a", 4, version=0)])
        await eventually(lambda: len(ckpt.read_lineage(root)) == 1, 60, "first step")
        # learner is at v1 with eta 0: version-0 samples are stale; a copy of group c re-formed with a
        # third rollout (signals after a restart) is the same request: dropped whole, as duplicates
        stale = sample_batch("b", 3, version=0)
        fresh = sample_batch("c", 2, version=1)
        copy = sample_batch("c", 3, version=1)
        await send_batches(kafka_config, [stale, fresh, copy])
        await eventually(lambda: len(ckpt.read_lineage(root)) == 2, 60, "second step")
        shutdown.set()
    lineage = ckpt.read_lineage(root)
    assert [sorted(e["keys"]) for e in lineage] == [["a/0/0", "a/1/0", "a/2/0", "a/3/0"], ["c/0/0", "c/1/0"]]
    metrics = await read_values(kafka_config, topics.METRICS)
    dropped = [m.value for m in metrics if m.name == "learner/policy/dropped_stale"]
    assert dropped and dropped[-1] == 3
    assert [m.value for m in metrics if m.name == "learner/policy/duplicates"][-1] == 3
    assert any(m.name == "staleness" and m.labels.get("model") == "policy" for m in metrics)
    # the distribution of the kept samples' staleness: a's 4 at v0 and c's 2 at v1, all fresh
    lags = [(m.labels["versions"], m.value) for m in metrics if m.name == "learner/policy/staleness_samples"]
    assert lags == [("0", 4.0), ("0", 2.0)]
    assert {"learner/policy/loss", "learner/policy/tokens_per_s", "learner/policy/kl"} <= {
        m.name for m in metrics
    }
    weights = [w for w in await read_values(kafka_config, topics.WEIGHTS) if w.model == "policy"]
    assert [w.version for w in weights] == [0, 1, 2]
    # the groups consumed by each version, for the scheduler's gate: a; then b (stale) and c, not c's copy
    assert [w.groups_consumed for w in weights] == [0, 1, 3]
    AutoModelForCausalLM.from_pretrained(weights[-1].uri)  # users can take the weights elsewhere
    state = ckpt.load_state(ckpt.latest_checkpoint(root))
    assert (
        state.version == 2 and state.dropped_stale == 3 and not state.pending and state.groups_consumed == 3
    )
    # a (newest sample v0) was forgotten once v0 was stale at v1: any copy of it is dropped as stale
    assert state.trained_groups == {"c": 1}


CHILD = """
import sys, anyio, msgspec, torch
torch.set_num_threads(1)
from schemas.config import RunConfig
from learners import policy
anyio.run(policy.run, msgspec.json.decode(open(sys.argv[1], "rb").read(), type=RunConfig))
"""


def start_learner(config_path: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", CHILD, str(config_path)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def test_kill9_between_checkpoints_then_restart(tmp_path: Path, kafka_config) -> None:
    """kill -9 after a publish that no checkpoint covers; the restart continues the versions, and the
    surviving weights' lineage trains every key exactly once."""
    import msgspec

    from schemas import topics

    config = role_config(tmp_path, kafka_config, checkpoint_every=2, eta=100)
    root = Path(config.workdir) / "checkpoints" / "policy"
    config_path, log = tmp_path / "config.json", tmp_path / "learner.log"
    config_path.write_bytes(msgspec.json.encode(config))
    first = [sample_batch(f"r{i}", 4) for i in range(3)]
    second = [sample_batch(f"s{i}", 4) for i in range(2)]
    all_keys = sorted(s.sample_key for b in first + second for s in b.samples)
    procs = [start_learner(config_path, log)]
    try:
        await send_batches(kafka_config, first)
        # steps 1-3 -> versions 1-3; checkpoints at versions 2 and 4: v3 is published, not checkpointed
        await eventually(lambda: len(ckpt.read_lineage(root)) >= 3, 120, "three steps before the kill")
        await wait_for_version(kafka_config, 3, 30)  # announced on forge.weights, not just in the store
        assert ckpt.latest_checkpoint(root).name == "step-00000002"
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        procs.append(start_learner(config_path, log))
        await send_batches(kafka_config, second)
        await eventually(lambda: sorted(lineage_keys(root)) == all_keys, 120, "every key in the lineage")
        await eventually(lambda: ckpt.latest_checkpoint(root).name == "step-00000005", 60, "final checkpoint")
        await wait_for_version(kafka_config, 6, 60)  # the publish follows its checkpoint
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    print(log.read_text()[-3000:])
    journal = [json.loads(x) for x in (root / "journal.jsonl").read_text().splitlines() if x.strip()]
    assert {"restored_step": 2, "from": "step-00000002"} in journal
    keys = lineage_keys(root)
    assert len(keys) == len(set(keys)) == 20  # no key trained twice, none skipped
    weights = [w.version for w in await read_values(kafka_config, topics.WEIGHTS) if w.model == "policy"]
    assert weights == [0, 1, 2, 3, 4, 5, 6]  # versions continue after the restart (v3 kept its number)
    state = ckpt.load_state(ckpt.latest_checkpoint(root))
    assert state.version == 6 and not state.pending
    assert sorted(state.trained_groups) == sorted(b.request_id for b in first + second)  # eta 100: all fresh


async def test_reward_role_trains_on_reward_samples(tmp_path: Path, kafka_config) -> None:

    from infra.bus import Bus
    from learners import reward
    from schemas import topics
    from schemas.config import ModelConfig, RewardLearnerConfig
    from schemas.events import RewardSample, RewardSampleBatch

    base = role_config(tmp_path, kafka_config)
    model = ModelConfig(preset=base.policy_model.preset, temperature=0.8)
    learner = RewardLearnerConfig(**ROLE_LEARNER)
    config = msgspec_replace(base, reward_model=model, reward_learner=learner)
    root = Path(config.workdir) / "checkpoints" / "reward"
    samples = [
        RewardSample(
            sample_key=f"j0/0/{s.key}",
            prompt_token_ids=s.prompt_ids,
            response_token_ids=s.response_ids,
            behaviour_logprobs=s.behaviour_logprobs,
            reward_version=0,
            advantage=s.advantage,
            reward=s.advantage,
        )
        for s in fixed_batch(4)
    ]
    shutdown = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: reward.run(config, shutdown=shutdown))
        async with Bus(kafka_config, role="test") as bus:
            await bus.send(
                topics.SAMPLES_REWARD, RewardSampleBatch(request_id="j0", samples=samples), key="j0"
            )
        await eventually(lambda: len(ckpt.read_lineage(root)) == 1, 60, "a reward-model step")
        shutdown.set()
    weights = [w for w in await read_values(kafka_config, topics.WEIGHTS)]
    assert [(w.model, w.version) for w in weights] == [("reward", 0), ("reward", 1)]


def msgspec_replace(struct, **changes):
    import msgspec

    return msgspec.structs.replace(struct, **changes)


async def test_role_with_lora_and_two_minibatches(tmp_path: Path, kafka_config) -> None:
    """LoRA adapters + two shuffled optimizer steps per batch of whole groups: one version per batch,
    merged weights published."""
    from transformers import AutoModelForCausalLM

    from learners import policy
    from schemas import topics

    config = role_config(tmp_path, kafka_config, lora_rank=4, minibatches=2)
    root = Path(config.workdir) / "checkpoints" / "policy"
    shutdown = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: policy.run(config, shutdown=shutdown))
        # batch_samples 4: group l0 (3 samples) is not enough, so l1 joins it whole (6 samples)
        await send_batches(kafka_config, [sample_batch("l0", 3), sample_batch("l1", 3)])
        await eventually(lambda: len(ckpt.read_lineage(root)) == 2, 60, "two minibatch steps")
        await eventually(lambda: ckpt.latest_checkpoint(root) is not None and ckpt.load_state(
            ckpt.latest_checkpoint(root)).version == 1, 60, "the batch's version checkpointed")  # fmt: skip
        shutdown.set()
    lineage = ckpt.read_lineage(root)
    assert [len(e["keys"]) for e in lineage] == [3, 3] and [e["version"] for e in lineage] == [0, 1]
    keys = [k for e in lineage for k in e["keys"]]
    assert sorted(keys) == sorted(f"l{g}/{i}/0" for g in range(2) for i in range(3))
    assert keys[:3] != ["l0/0/0", "l0/1/0", "l0/2/0"]  # shuffled across the two groups (seeded)
    weights = [w for w in await read_values(kafka_config, topics.WEIGHTS) if w.model == "policy"]
    assert [w.version for w in weights] == [0, 1]
    v0 = AutoModelForCausalLM.from_pretrained(weights[0].uri).state_dict()
    v2 = AutoModelForCausalLM.from_pretrained(weights[-1].uri).state_dict()
    assert set(v0) == set(v2)  # plain HF names: adapters merged
    assert any(not torch.equal(v0[n], v2[n]) for n in v0 if "q_proj" in n)


async def test_two_epochs_pass_twice_over_one_batch(tmp_path: Path, kafka_config) -> None:
    """epochs = 2, minibatches = 2: four optimizer steps over the same 6 samples, each sample once per
    epoch (the second pass reshuffled), one version at the end, samples counted once."""
    from learners import policy

    config = role_config(tmp_path, kafka_config, minibatches=2, epochs=2)
    root = Path(config.workdir) / "checkpoints" / "policy"
    shutdown = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: policy.run(config, shutdown=shutdown))
        await send_batches(kafka_config, [sample_batch("l0", 3), sample_batch("l1", 3)])
        await eventually(lambda: len(ckpt.read_lineage(root)) == 4, 60, "four steps")
        await eventually(lambda: ckpt.latest_checkpoint(root) is not None and ckpt.load_state(
            ckpt.latest_checkpoint(root)).version == 1, 60, "the batch's version checkpointed")  # fmt: skip
        shutdown.set()
    lineage = ckpt.read_lineage(root)
    assert [e["version"] for e in lineage] == [0, 0, 0, 1]
    assert [e.get("epoch", 0) for e in lineage] == [0, 0, 1, 1]
    first = [k for e in lineage[:2] for k in e["keys"]]
    second = [k for e in lineage[2:] for k in e["keys"]]
    assert sorted(first) == sorted(second) == sorted(f"l{g}/{i}/0" for g in range(2) for i in range(3))
    assert first != second  # reshuffled
    assert ckpt.load_state(ckpt.latest_checkpoint(root)).samples_trained == 6


def test_stub_trainer_keeps_the_step_plan_and_takes_its_time() -> None:
    """`engine = stub` (system benchmarks): the real learner's steps (2 epochs x 2 minibatches, each sample
    once per epoch), each sleeping stub_sample_s per sample, and no weights touched."""
    from learners.core import StubTrainer, step_plan

    cfg = LearnerConfig(minibatches=2, epochs=2, stub_sample_s=0.01)
    batch = fixed_batch(6, seed=1)
    start = time.perf_counter()
    steps = list(StubTrainer(cfg).batch_steps(batch, first_step=5))
    assert time.perf_counter() - start >= 4 * 3 * 0.01
    assert [(epoch, last) for epoch, last, _ in steps] == [(0, False), (0, False), (1, False), (1, True)]
    plan = step_plan(6, cfg, 5)
    assert [stats.keys for _, _, stats in steps] == [[batch[i].key for i in picked] for _, _, picked in plan]
    assert sorted(plan[0][2] + plan[1][2]) == sorted(plan[2][2] + plan[3][2]) == list(range(6))
    assert plan[0][2] + plan[1][2] != plan[2][2] + plan[3][2]  # the second epoch reshuffled


def test_replay_trains_through_the_learners_filter(tmp_path: Path) -> None:
    """Replay trains what the live reward learner would: a sample with a token id the model lacks is
    counted and skipped (before, replay handed it to the embedding, which raised)."""
    import msgspec

    from infra.config import load_config
    from infra.models import prepare_preset
    from learners.replay import train_reward_model
    from schemas.events import RewardSample, RewardSampleBatch
    from tests.conftest import TEST_PRESETS

    config = msgspec.structs.replace(load_config(TEST_PRESETS, environ={}), workdir=str(tmp_path))
    folder = prepare_preset(config.reward_model, role="reward", workdir=tmp_path)  # built by `make test`
    rewards = [RewardSample(sample_key=f"r/0/{i}/0", prompt_token_ids=s.prompt_ids, response_token_ids=s.response_ids,
                            behaviour_logprobs=s.behaviour_logprobs, reward_version=0, advantage=s.advantage,
                            reward=s.advantage) for i, s in enumerate(fixed_batch(4))]  # fmt: skip
    unknown = msgspec.structs.replace(
        rewards[1], response_token_ids=[10**6] * len(rewards[1].response_token_ids)
    )
    batch = RewardSampleBatch(request_id="r", samples=[rewards[0], unknown, *rewards[2:]])
    _, _, losses, invalid = train_reward_model(folder, [batch], config, epochs=1, seed=0)
    assert invalid == 1 and losses and all(math.isfinite(x) for x in losses)
