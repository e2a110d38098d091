"""The learner loop shared by the policy and reward learners.

Consumes: sample batches (PolicySampleBatch / RewardSampleBatch) from one topic, group-consumed.
Produces: WeightsPublished on forge.weights (key = model name; bytes in the weight store),
          metrics learner/<name>/{version,loss,kl,clip_fraction,is_weight_mean,lr,tokens_per_s,grad_norm,
          dropped_stale,dropped_invalid,duplicates,samples_trained,listed_token_mass,listed_mass} and `staleness` (mean over the
          samples of a step, label model=<name>).
Loop: consume -> dedupe by group (a request trains once) -> drop whole groups older than version - eta
-> a batch of whole groups -> proximal logprobs once (no grad) -> `minibatches` shuffled steps (token-budget
micro-batches, algorithm.policy_loss, AdamW with a linear warm-up) -> every `publish_every` batches a
new version: a checkpoint first, then the publish, then the offset commit.
Invariant: offsets are committed only after a checkpoint that includes them, and a checkpoint holds
the consumed-but-untrained samples, so after kill -9 and restart no sample key is trained twice by
the surviving weights and none is skipped. A group (one rollout request) trains at most once, whatever
copies signals publishes (a redelivery, or a group re-formed after a restart with other rollouts): a
trained group is remembered until its newest sample is older than version - eta, from when on any copy
is stale; so the memory holds about eta versions of groups, with no cap. Versions only grow: a restart
continues from max(checkpoint version, newest published version).
Ranks: under torchrun (`engine = "deepspeed"`) one learner role spans every rank. Rank 0 alone talks
to Kafka (consumes, decides when to train, commits, publishes, reports); before each collective act
(train a batch, checkpoint, publish) it broadcasts the act with its pending samples and state, and every
rank does it together: each optimizer step's samples are shared out (every world-th), ZeRO averages the
gradients, and only rank 0 writes the journal, the checkpoints and the weights. The others wait in
`follow_rank0` until rank 0 releases them; after a crash torchrun ends the whole world.
"""

from __future__ import annotations

import collections
import copy
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import torch
from torch import Tensor

from algorithm import filter_stale, listed_conditional_loss, listed_token_loss, policy_loss
from infra.bus import BatchConsumer, Bus, Record
from infra.models import answer_logprobs, load_trainable, next_token_logprobs, sequence_logprobs
from infra.weights import WeightStore
from learners import checkpoint as ckpt
from learners.checkpoint import LearnerState, TrainSample
from learners.engine import Engine, build_engine
from schemas import topics
from schemas.config import LearnerConfig, ModelConfig, PolicyLearnerConfig, RunConfig
from schemas.events import WeightsPublished


@dataclass(frozen=True)
class LearnerSpec:
    name: Literal["policy", "reward"]
    topic: str  # logical samples topic
    group: str
    version_field: str  # "policy_version" / "reward_version" on the sample
    model: ModelConfig
    learner: LearnerConfig
    eta: int  # staleness bound in this learner's own versions


def to_train_samples(batch: Any, version_field: str, vocab_size: int) -> tuple[list[TrainSample], int]:
    """Normalise a sample batch; samples that cannot be trained (empty, inconsistent, or a token id the
    model does not have: it would fail in the embedding, after the checkpoint kept it) are counted."""
    out, invalid = [], 0
    for s in batch.samples:
        listed = getattr(s, "listed_tokens", [])
        answers = getattr(s, "listed_answers", [])
        if (
            not s.response_token_ids
            or not s.prompt_token_ids
            or len(s.behaviour_logprobs) != len(s.response_token_ids)
            or max(
                max(s.prompt_token_ids), max(s.response_token_ids), max(listed, default=0), *map(max, answers)
            )
            >= vocab_size
            or getattr(s, "advantage_from", 0) >= len(s.response_token_ids)
            or (listed and s.unlisted_at >= len(s.response_token_ids))
        ):
            invalid += 1
            continue
        out.append(
            TrainSample(
                key=s.sample_key,
                prompt_ids=list(s.prompt_token_ids),
                response_ids=list(s.response_token_ids),
                behaviour_logprobs=list(s.behaviour_logprobs),
                version=getattr(s, version_field),
                advantage=s.advantage,
                group=batch.request_id,
                advantage_from=getattr(s, "advantage_from", 0),
                unlisted_at=getattr(s, "unlisted_at", 0),
                listed_tokens=list(listed),
                listed_answers=[list(a) for a in answers],
            )
        )
    return out, invalid


def warmup_lr(lr: float, step: int, warmup_steps: int) -> float:
    """Learning rate of optimizer step `step` (0-based): rises linearly over `warmup_steps`, then `lr`."""
    if warmup_steps <= 0:
        return lr
    return lr * min(1.0, (step + 1) / warmup_steps)


def whole_groups(samples: list[TrainSample], at_least: int) -> list[TrainSample]:
    """The first groups of `samples` (in order of first appearance), whole, until at least `at_least`."""
    order: dict[str, list[TrainSample]] = {}
    for s in samples:
        order.setdefault(s.group_id, []).append(s)
    batch: list[TrainSample] = []
    for members in order.values():
        if len(batch) >= at_least:
            break
        batch += members
    return batch


def pack_micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Indices grouped so each group's padded size (count x longest) fits the budget.

    Longest first, greedy; a sample longer than the budget gets a micro-batch of its own.
    Deterministic for equal inputs (ties keep input order)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def pad(rows: list[Tensor] | list[list[float]], width: int) -> Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        r = torch.as_tensor(r, dtype=torch.float32)
        out[i, : r.shape[0]] = r
    return out


def reference_weights(
    model: ModelConfig, cfg: LearnerConfig, *, role: Literal["policy", "reward"], workdir: Path
) -> torch.nn.Module | None:
    """The start weights, frozen, for the reference KL (`cfg.ref_kl_coef` > 0), else None."""
    if cfg.ref_kl_coef <= 0:
        return None
    reference, _ = load_trainable(model, role=role, workdir=workdir)
    return reference.eval().requires_grad_(False)


@dataclass
class StepStats:
    loss: float = 0.0
    kl: float = 0.0
    ref_kl: float = 0.0
    clip_fraction: float = 0.0
    is_weight_mean: float = 0.0
    listed_token_mass: float = 0.0  # mean probability of staying on a listed answer where answers left them
    listed_mass: float = 0.0  # mean probability of naming a listed action where valid answers were played
    grad_norm: float = 0.0
    lr: float = 0.0
    samples: int = 0
    tokens: int = 0
    seconds: float = 0.0
    keys: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def step_plan(size: int, cfg: LearnerConfig, first_step: int) -> list[tuple[int, bool, list[int]]]:
    """(epoch, whether it is the batch's last step, sample indices) of each optimizer step of a batch
    of `size`: `minibatches` chunks per epoch, epoch e > 0 a seeded reshuffle of the same batch."""
    chunk = -(-size // cfg.minibatches)
    orders = [list(range(size))]
    for epoch in range(1, cfg.epochs):
        orders.append(random.Random(first_step * 1000 + epoch).sample(orders[0], size))
    return [(epoch, epoch == len(orders) - 1 and lo + chunk >= size, order[lo : lo + chunk])
            for epoch, order in enumerate(orders) for lo in range(0, size, chunk)]  # fmt: skip


class StubTrainer:
    """`learner.engine = stub` (system benchmarks): the step plan of a real batch, each step sleeping
    `stub_sample_s` per sample instead of computing, as a learner on a device of its own would take
    time without using this machine's cores. The weights never change."""

    def __init__(self, cfg: LearnerConfig) -> None:
        self.cfg = cfg

    def batch_steps(
        self, batch: list[TrainSample], *, first_step: int
    ) -> Iterator[tuple[int, bool, StepStats]]:
        for epoch, last, picked in step_plan(len(batch), self.cfg, first_step):
            start = time.perf_counter()
            time.sleep(self.cfg.stub_sample_s * len(picked))
            samples = [batch[i] for i in picked]
            stats = StepStats(samples=len(samples), keys=[s.key for s in samples],
                              tokens=sum(len(s.prompt_ids) + len(s.response_ids) for s in samples))  # fmt: skip
            stats.seconds = time.perf_counter() - start
            yield epoch, last, stats


class Trainer:
    """Decoupled-PPO updates on an Engine (blocking; call it from a worker thread)."""

    def __init__(
        self, engine: Engine, cfg: LearnerConfig, temperature: float, reference: torch.nn.Module | None = None
    ) -> None:
        """`reference`: frozen start weights for the reference KL (`cfg.ref_kl_coef` > 0), else None."""
        if cfg.ref_kl_coef > 0 and reference is None:
            raise ValueError(
                f"ref_kl_coef = {cfg.ref_kl_coef} needs the reference weights (set it to 0 for none)"
            )
        self.engine, self.cfg, self.temperature = engine, cfg, temperature
        self.reference = reference if cfg.ref_kl_coef > 0 else None
        self.listed_token_coef = cfg.listed_token_coef if isinstance(cfg, PolicyLearnerConfig) else 0.0
        self.listed_conditional = isinstance(cfg, PolicyLearnerConfig) and cfg.listed_conditional

    def logprobs(self, samples: list[TrainSample], module: torch.nn.Module | None = None) -> list[Tensor]:
        return sequence_logprobs(
            self.engine.module if module is None else module,
            [s.prompt_ids for s in samples],
            [s.response_ids for s in samples],
            self.temperature,
        )

    def proximal(self, samples: list[TrainSample]) -> list[Tensor]:
        """Logprobs under the weights before this batch's updates, micro-batched, no grad."""
        return self._frozen_logprobs(samples, None)

    def _frozen_logprobs(self, samples: list[TrainSample], module: torch.nn.Module | None) -> list[Tensor]:
        """Micro-batched logprobs without grad under `module` (None: the trained weights as they are)."""
        out: list[Tensor | None] = [None] * len(samples)
        with torch.no_grad():
            for mb in self._aligned(pack_micro_batches(self._lengths(samples), self.cfg.micro_batch_tokens)):
                if not mb and module is None:  # ZeRO-3 gathers parameters collectively in every forward
                    self._zero_loss()
                for i, lp in zip(mb, self.logprobs([samples[i] for i in mb], module), strict=True):
                    out[i] = lp.detach()
        return out  # type: ignore[return-value]

    @staticmethod
    def _lengths(samples: list[TrainSample]) -> list[int]:
        return [len(s.prompt_ids) + len(s.response_ids) for s in samples]

    def _aligned(self, groups: list[list[int]]) -> list[list[int]]:
        """Data parallel: every rank must run as many backward passes as the busiest one."""
        if self.engine.world_size == 1:
            return groups
        count = torch.tensor(len(groups))
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
        return groups + [[] for _ in range(int(count) - len(groups))]

    def _zero_loss(self) -> Tensor:
        device = next(self.engine.module.parameters()).device
        out = self.engine.module(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device))
        return out.logits.sum() * 0.0

    def batch_steps(
        self, batch: list[TrainSample], *, first_step: int
    ) -> Iterator[tuple[int, bool, StepStats]]:
        """Train one batch: proximal logprobs once, then `minibatches` steps per epoch over `epochs`
        seeded shuffles, the lr warmed up from optimizer step `first_step`; yields (epoch, whether
        this is the batch's last step, stats)."""
        cfg, rank, world = self.cfg, self.engine.rank, self.engine.world_size
        plan = step_plan(len(batch), cfg, first_step)
        # data parallel: every rank holds the whole batch and takes every world-th sample of each step
        mine = sorted({i for _, _, picked in plan for i in picked[rank::world]})
        at = {i: j for j, i in enumerate(mine)}
        prox = self.proximal([batch[i] for i in mine]) if cfg.minibatches > 1 or cfg.epochs > 1 else None
        ref = (
            self._frozen_logprobs([batch[i] for i in mine], self.reference)
            if self.reference is not None
            else None
        )
        for n, (epoch, last, picked) in enumerate(plan, start=first_step):
            lr = warmup_lr(cfg.lr, n, cfg.warmup_steps)
            self.engine.set_lr(lr)
            shard = picked[rank::world]
            stats = self.step(
                [batch[i] for i in shard],
                None if prox is None else [prox[at[i]] for i in shard],
                None if ref is None else [ref[at[i]] for i in shard],
            )
            stats.lr = lr
            stats.keys = [batch[i].key for i in picked]  # the step trained all of them, across ranks
            yield epoch, last, stats

    def step(
        self, samples: list[TrainSample], prox: list[Tensor] | None = None, ref: list[Tensor] | None = None
    ) -> StepStats:
        """One optimizer step on `samples` (their batch-mean loss). `prox=None`: the proximal
        policy is the current one, so its logprobs are the current ones detached (one forward saved).
        `ref`: the reference policy's logprobs of each sample (the reference KL term), or None."""
        start = time.perf_counter()
        cfg, n = self.cfg, len(samples)
        stats = StepStats(samples=n, tokens=sum(self._lengths(samples)), keys=[s.key for s in samples])
        tokens_seen = 0
        for mb in self._aligned(pack_micro_batches(self._lengths(samples), cfg.micro_batch_tokens)):
            if not mb:  # this rank has fewer micro-batches than another: a no-op backward keeps the
                self.engine.backward(self._zero_loss())  # gradient collectives in step
                continue
            group = [samples[i] for i in mb]
            width = max(len(s.response_ids) for s in group)
            logp_rows = self.logprobs(group)
            logp = torch.stack([torch.nn.functional.pad(r, (0, width - r.shape[0])) for r in logp_rows])
            prox_t = logp.detach() if prox is None else pad([prox[i] for i in mb], width)
            behav = pad([s.behaviour_logprobs for s in group], width)
            mask = pad([[0.0] * s.advantage_from + [1.0] * (len(s.response_ids) - s.advantage_from)
                        for s in group], width)  # fmt: skip
            adv = torch.tensor([s.advantage for s in group], dtype=torch.float32)
            ref_t = None if ref is None else pad([ref[i] for i in mb], width)
            loss, diag = policy_loss(logp, prox_t, behav, adv, mask, cfg.clip, cfg.kl_coef, cfg.is_cap,
                                     ref_logp=ref_t, ref_kl_coef=cfg.ref_kl_coef)  # fmt: skip
            self.engine.backward(loss * (len(mb) / n))  # shard mean = sample-weighted micro-batch means
            ntok = int(mask.sum())
            stats.loss += float(loss.detach()) * len(mb) / n
            for name in ("kl", "ref_kl", "clip_fraction", "is_weight_mean"):
                setattr(stats, name, getattr(stats, name) + diag[name] * ntok)
            tokens_seen += ntok
        for name in ("kl", "ref_kl", "clip_fraction", "is_weight_mean"):
            setattr(stats, name, getattr(stats, name) / max(tokens_seen, 1))
        if self.listed_token_coef > 0:
            stats.listed_token_mass = self._listed_token_backward([s for s in samples if s.listed_tokens])
        if self.listed_conditional:
            stats.listed_mass = self._listed_conditional_backward(samples)
        stats.grad_norm = self.engine.step()
        stats.seconds = time.perf_counter() - start
        return stats

    def _listed_conditional_backward(self, samples: list[TrainSample]) -> float:
        """Back-propagate the listed-conditional term of the step's played valid answers (those that carry
        their state's listed answers), weighted as the policy loss weighs a sample (1 / the step's
        samples), micro-batched by whole states (a prompt plus its answers); returns the mean listed mass."""
        rows = [s for s in samples if s.listed_answers]

        def term(group: list[TrainSample]) -> tuple[Tensor, Tensor]:
            per_state = answer_logprobs(self.engine.module, [s.prompt_ids for s in group],
                                        [s.listed_answers for s in group], self.temperature)  # fmt: skip
            adv = torch.tensor([s.advantage for s in group], dtype=torch.float32)
            tokens = torch.tensor(
                [len(s.response_ids) - s.advantage_from for s in group], dtype=torch.float32
            )
            return listed_conditional_loss(per_state, adv, tokens)

        sizes = [len(s.prompt_ids) + sum(map(len, s.listed_answers)) for s in rows]
        return self._summed_backward(rows, sizes, term, 1.0 / len(samples))

    def _listed_token_backward(self, rows: list[TrainSample]) -> float:
        """Back-propagate listed_token_coef x the listed-token loss (mean over `rows`, the samples whose
        answer left the listed answers); returns the mean probability of staying listed there."""

        def term(group: list[TrainSample]) -> tuple[Tensor, Tensor]:
            logprobs = next_token_logprobs(self.engine.module, [s.prompt_ids for s in group],
                                           [s.response_ids[: s.unlisted_at] for s in group], self.temperature)  # fmt: skip
            return listed_token_loss(logprobs, [s.listed_tokens for s in group])

        sizes = [len(s.prompt_ids) + s.unlisted_at for s in rows]
        return self._summed_backward(rows, sizes, term, self.listed_token_coef / max(len(rows), 1))

    def _summed_backward(self, rows: list[TrainSample], sizes: list[int],
                         term: Callable[[list[TrainSample]], tuple[Tensor, Tensor]], weight: float) -> float:  # fmt: skip
        """Back-propagate `weight` x the sum over `rows` of a per-sample term (`term(group)` gives the group's
        mean and each sample's mass), micro-batched by `sizes` (a sum, so each micro-batch backs up on its
        own); returns the mean mass over `rows`."""
        masses = 0.0
        for mb in self._aligned(pack_micro_batches(sizes, self.cfg.micro_batch_tokens)):
            if not mb:
                self.engine.backward(self._zero_loss())
                continue
            loss, mass = term([rows[i] for i in mb])
            self.engine.backward(loss * (weight * len(mb)))
            masses += float(mass.sum())
        return masses / len(rows) if rows else 0.0


def apply_lora(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    return get_peft_model(
        model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets)
    )


@dataclass
class LearnerStep:
    """What one learner step did: its stats, the version it made, the weights it published (if any) and
    the offsets it made safe to commit."""

    stats: StepStats
    version: int
    published: WeightsPublished | None = None
    committed: dict[tuple[str, int], int] | None = None  # offsets safe to commit (in a checkpoint)


class Learner:
    """Model, engine, durable state and the weight store: the blocking half of the learner role."""

    def __init__(self, config: RunConfig, spec: LearnerSpec) -> None:
        torch.set_num_threads(spec.model.torch_threads)
        self.spec, self.cfg = spec, spec.learner
        workdir = Path(config.workdir)
        self.root = workdir / "checkpoints" / spec.name
        self.store = WeightStore.for_run(config)
        model, self.tokenizer = load_trainable(spec.model, role=spec.name, workdir=workdir)
        if self.cfg.lora_rank > 0:
            model = apply_lora(model, self.cfg.lora_rank)
        model.eval()  # no dropout: behaviour, proximal and current logprobs must be comparable
        self.state = LearnerState(groups_consumed=0)
        ckpt.remove_leftovers(self.root)
        latest = ckpt.latest_checkpoint(self.root)
        if latest is not None:
            ckpt.load_model_weights(latest, model)
            self.state = ckpt.load_state(latest)
        self.model = model
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.engine = build_engine(model, self.cfg)
        if latest is not None:
            self.engine.load_optimizer_state(ckpt.load_optimizer_tensors(latest), self.state.optimizer_step)
            if self.engine.rank == 0:
                ckpt.append_journal(
                    self.root, {"restored_step": self.state.optimizer_step, "from": latest.name}
                )
        self.trainer: Trainer | StubTrainer
        if self.cfg.engine == "stub":  # no update, so no reference weights to hold
            self.trainer = StubTrainer(self.cfg)
        else:  # a restart reloads the reference from the preset: the start weights, not the checkpoint's
            reference = reference_weights(spec.model, self.cfg, role=spec.name, workdir=workdir)
            self.trainer = Trainer(self.engine, self.cfg, spec.model.temperature, reference)
        self.pending: list[TrainSample] = list(self.state.pending)
        self.offsets = ckpt.offsets_from_state(self.state.offsets)
        self.dirty = False  # progress since the last checkpoint
        self.dropped_invalid = 0  # samples that cannot be trained (empty or inconsistent), this process
        self.waiting_since: float | None = None  # when an idle topic first left a partial batch waiting

    # --- consume ---
    def ingest(self, records: list[Record[Any]]) -> int:
        """Queue new samples; returns how many were duplicates (their group already trained or queued)."""
        dups = 0
        queued = {s.group_id for s in self.pending}
        for r in records:
            self.offsets[(r.topic, r.partition)] = r.offset + 1
            samples, invalid = to_train_samples(r.value, self.spec.version_field, self.vocab_size)
            self.dropped_invalid += invalid
            for s in samples:  # a group's samples come in one record: a group seen before is a copy
                if s.group_id in queued or s.group_id in self.state.trained_groups:
                    dups += 1
                else:
                    self.pending.append(s)
            queued |= {s.group_id for s in samples}
            self.dirty = True
        self.state.duplicates += dups
        return dups

    def ready(self, idle: bool, now: float | None = None) -> bool:
        """A full batch, or (the topic idle) a partial one whose oldest sample waited batch_wait_s."""
        if len(self.pending) >= self.cfg.batch_samples:
            return True
        if not (idle and self.pending):
            return False
        self.waiting_since = self.waiting_since if self.waiting_since is not None else time.monotonic()
        return (now if now is not None else time.monotonic()) - self.waiting_since >= self.cfg.batch_wait_s

    # --- train ---
    def drop_stale(self) -> tuple[int, list[int]]:
        """Drop pending groups whose oldest sample is older than version - eta, whole (the first steps
        of an episode carry its contrast as much as the last); returns (samples dropped, staleness
        of the kept)."""
        oldest: dict[str, int] = {}
        for s in self.pending:
            oldest[s.group_id] = min(oldest.get(s.group_id, s.version), s.version)
        groups = list(oldest)
        kept, _ = filter_stale([oldest[g] for g in groups], self.state.version, self.spec.eta)
        # a trained group whose newest sample is now stale needs no memory: any copy of it is stale too
        floor = self.state.version - self.spec.eta
        self.state.trained_groups = {g: v for g, v in self.state.trained_groups.items() if v >= floor}
        fresh = {groups[i] for i in kept}
        self._consumed(len(groups) - len(fresh))
        before = len(self.pending)
        self.pending = [s for s in self.pending if s.group_id in fresh]
        dropped = before - len(self.pending)
        self.state.dropped_stale += dropped
        return dropped, [self.state.version - s.version for s in self.pending]

    # --- ranks: rank 0 reads Kafka and decides; every rank trains, gathers and saves together ---
    def train_batch(self) -> list[LearnerStep]:
        """Train the next batch on every rank (rank 0 calls it)."""
        self._share("train")
        return self._train_batch()

    def checkpoint(self) -> dict[tuple[str, int], int]:
        """Write a checkpoint now, every rank taking part (rank 0 calls it); the offsets it covers."""
        self._share("checkpoint")
        return self._checkpoint()

    def publish(self) -> WeightsPublished | None:
        """Publish the current weights as this version, every rank taking part (rank 0 calls it)."""
        self._share("publish")
        return self._publish()

    def release_ranks(self) -> None:
        """Rank 0 is done: the other ranks leave `follow_rank0`."""
        self._share("stop")

    def follow_rank0(self) -> None:
        """Ranks > 0: do what rank 0 asks, with its pending samples and state, until it stops."""
        while (command := self._share("")) != "stop":
            {"train": self._train_batch, "checkpoint": self._checkpoint, "publish": self._publish}[command]()

    def _share(self, command: str) -> str:
        """Rank 0 sends `command`, its pending samples and its state; the other ranks take them."""
        if self.engine.world_size == 1:
            return command
        box: list[Any] = [command, self.pending, self.state] if self.engine.rank == 0 else [None] * 3
        torch.distributed.broadcast_object_list(box, src=0)
        command, self.pending, self.state = box
        return command

    def _train_batch(self) -> list[LearnerStep]:
        """Train the next batch (whole groups, at least batch_samples samples): proximal logprobs once,
        then `minibatches` optimizer steps per epoch over seeded shuffles, each step's samples shared out
        across the ranks; a new version after every `publish_every` batches."""
        batch = whole_groups(self.pending, self.cfg.batch_samples)
        self._consumed(len({s.group_id for s in batch}))
        for s in batch:  # remembered by their newest sample (see drop_stale)
            newest = self.state.trained_groups.get(s.group_id, s.version)
            self.state.trained_groups[s.group_id] = max(newest, s.version)
        random.Random(self.state.optimizer_step).shuffle(batch)
        done = []
        for epoch, last, stats in self.trainer.batch_steps(batch, first_step=self.state.optimizer_step):
            if epoch == 0:
                keys = set(stats.keys)
                self.pending = [s for s in self.pending if s.key not in keys]
                self.state.samples_trained += len(stats.keys)
            self.waiting_since = None
            self.state.optimizer_step += 1
            self.dirty = True
            step = LearnerStep(stats=stats, version=self.state.version)
            if last:
                self.state.batches += 1
            new_version = last and self.state.batches % self.cfg.publish_every == 0
            if new_version:
                self.state.version += 1
                step.version = self.state.version
            # journal before checkpoint: a kill -9 between them leaves the checkpoint's step in the
            # lineage, and a step the checkpoint lacks is cut out by the restore's own line
            if self.engine.rank == 0:
                entry = {"step": self.state.optimizer_step, "version": self.state.version, "keys": stats.keys}
                ckpt.append_journal(self.root, entry if epoch == 0 else entry | {"epoch": epoch})
            if new_version:
                if self.state.version % self.cfg.checkpoint_every == 0:
                    step.committed = self._checkpoint()
                step.published = self._publish()
            done.append(step)
        return done

    def _consumed(self, groups: int) -> None:
        if self.state.groups_consumed is not None:  # None: restored from a checkpoint that did not count
            self.state.groups_consumed += groups

    # --- persist ---
    def _checkpoint(self) -> dict[tuple[str, int], int]:
        """Write a complete checkpoint (rank 0 writes; ZeRO gathers on every rank); returns the offsets
        it covers (now safe to commit)."""
        self.state.offsets = ckpt.offsets_to_state(self.offsets)
        self.state.pending = list(self.pending)
        tensors, _ = self.engine.optimizer_state()
        with self.engine.full_parameters():
            if self.engine.rank == 0:
                ckpt.save_checkpoint(self.root, self.state, self.model, tensors)
        self.dirty = False
        return dict(self.offsets)

    def _publish(self) -> WeightsPublished | None:
        with self.engine.full_parameters():
            if self.engine.rank != 0:
                return None
            model = self.model
            if self.cfg.lora_rank > 0:  # actors load plain HF folders: merge the adapters into a copy
                model = copy.deepcopy(model).merge_and_unload()
            return self.store.publish(
                self.spec.name,
                self.state.version,
                model,
                self.tokenizer,
                preset=self.spec.model.preset,
                optimizer_step=self.state.optimizer_step,
                groups_consumed=self.state.groups_consumed,
            )


async def latest_published(bus: Bus, name: str) -> int | None:
    versions = [r.value.version for r in await bus.read_topic(topics.WEIGHTS) if r.value.model == name]
    return max(versions) if versions else None


async def run_learner(config: RunConfig, spec: LearnerSpec, *, shutdown: anyio.Event | None = None) -> None:
    shutdown = shutdown or anyio.Event()
    learner = await anyio.to_thread.run_sync(Learner, config, spec)
    if learner.engine.rank > 0:  # under torchrun: only rank 0 talks to Kafka
        await anyio.to_thread.run_sync(learner.follow_rank0)
        return
    await _lead(learner, config, spec, shutdown)
    # a clean stop releases the other ranks; after a crash torchrun ends them (they wait in a collective)
    await anyio.to_thread.run_sync(learner.release_ranks)


async def _lead(learner: Learner, config: RunConfig, spec: LearnerSpec, shutdown: anyio.Event) -> None:
    """Rank 0 (or the only process): read samples, decide when to train, commit and report."""
    name, cfg = spec.name, spec.learner
    async with Bus(config.kafka, role=f"{name}-learner") as bus:
        latest = await latest_published(bus, name)
        # versions only grow: weights published after the last checkpoint keep their numbers
        learner.state.version = max(learner.state.version, latest if latest is not None else 0)
        if latest is None or latest < learner.state.version:  # v0 = the preset weights, or a lost publish
            event = await anyio.to_thread.run_sync(learner.publish)
            if event is not None:
                await bus.send(topics.WEIGHTS, event, key=name)
        await bus.metric(f"learner/{name}/version", learner.state.version, step=learner.state.version)
        async with BatchConsumer(bus, [spec.topic], group=spec.group) as consumer:
            if learner.offsets:
                await consumer.seek(dict(learner.offsets))
            while not shutdown.is_set():
                records = await consumer.next_batch(cfg.batch_samples, cfg.poll_timeout_s)
                invalid_before = learner.dropped_invalid
                dups = learner.ingest(records)
                if dups:
                    await bus.metric(f"learner/{name}/duplicates", learner.state.duplicates)
                if learner.dropped_invalid != invalid_before:
                    await bus.metric(f"learner/{name}/dropped_invalid", learner.dropped_invalid)
                while learner.ready(idle=not records):
                    dropped, staleness = learner.drop_stale()
                    if dropped:
                        await bus.metric(f"learner/{name}/dropped_stale", learner.state.dropped_stale)
                    if staleness:
                        v = learner.state.version
                        await bus.metric("staleness", sum(staleness) / len(staleness), step=v, model=name)
                        for lag, count in sorted(collections.Counter(staleness).items()):  # the distribution
                            await bus.metric(f"learner/{name}/staleness_samples", float(count), step=v,
                                             versions=str(lag))  # fmt: skip
                    if not learner.pending:
                        break
                    for step in await anyio.to_thread.run_sync(learner.train_batch):
                        await _report(bus, consumer, name, step)
                        await bus.metric(f"learner/{name}/samples_trained", learner.state.samples_trained)
            if learner.dirty:  # graceful stop: keep the progress and the consumed-but-untrained samples
                offsets = await anyio.to_thread.run_sync(learner.checkpoint)
                await consumer.commit(offsets)


async def _report(bus: Bus, consumer: Any, name: str, step: LearnerStep) -> None:
    if step.committed is not None:
        await consumer.commit(step.committed)
    if step.published is not None:
        await bus.send(topics.WEIGHTS, step.published, key=name)
        await bus.metric(f"learner/{name}/version", step.version, step=step.version)
    s, v = step.stats, step.version
    for metric, value in (
        ("loss", s.loss),
        ("kl", s.kl),
        ("ref_kl", s.ref_kl),
        ("clip_fraction", s.clip_fraction),
        ("is_weight_mean", s.is_weight_mean),
        ("lr", s.lr),
        ("grad_norm", s.grad_norm),
        ("tokens_per_s", s.tokens_per_s),
    ):
        await bus.metric(f"learner/{name}/{metric}", value, step=v)
    if s.listed_token_mass > 0:  # the listed-token loss is on (policy_learner.listed_token_coef)
        await bus.metric(f"learner/{name}/listed_token_mass", s.listed_token_mass, step=v)
    if s.listed_mass > 0:  # the listed-conditional term is on (policy_learner.listed_conditional)
        await bus.metric(f"learner/{name}/listed_mass", s.listed_mass, step=v)
