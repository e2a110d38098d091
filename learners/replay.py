"""replay: retrain a reward model from the topics, with today's formulas and settings.

Consumes `forge.trajectories.judged` from the beginning with no consumer group (it disturbs no live
role), keeps records whose *record timestamps* fall in [since, until) (Tansu's offsets_for_times is
unreliable, so we filter ourselves), gathers whole groups (a request's group_size distinct rollouts;
redelivered copies count once), and recomputes reward-model samples with `pipeline.samples.build_samples`
under the given λ and accuracy window. With `train=True` it trains a reward-model version from a
chosen starting point (`preset`, `latest` published version, `vN`, or an HF folder) with the same
decoupled-PPO loss as the live reward learner, writes it to `out` as a plain Hugging Face folder
(safetensors), and optionally publishes it to the weight store and `forge.weights`.

Invariant: replay reads only; it publishes nothing unless asked, and a published version is
numbered after every version already on `forge.weights`, so versions only grow.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from infra.bus import Bus
from pipeline.groups import complete_groups
from pipeline.samples import build_samples
from schemas import topics
from schemas.config import RunConfig
from schemas.events import JudgedTrajectory, RewardSampleBatch

log = logging.getLogger("forgestream.replay")


@dataclass
class ReplayResult:
    records_read: int = 0
    records_in_range: int = 0
    groups_complete: int = 0
    groups_incomplete: int = 0
    groups_rejected_variant: int = 0
    reward_samples: int = 0
    samples_invalid: int = 0  # dropped by the learner's filter (a token id the model lacks, ...)
    optimizer_steps: int = 0
    losses: list[float] = field(default_factory=list)
    model_dir: str | None = None
    published_version: int | None = None
    started_from: str = ""

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "losses"} | {
            "first_loss": self.losses[0] if self.losses else None,
            "last_loss": self.losses[-1] if self.losses else None,
        }


def rejected_variants(task_records: list[Any]) -> set[str]:
    """Variants that were retired without ever being active: their rollouts never train."""
    was_active: set[str] = set()
    retired: set[str] = set()
    for r in task_records:  # the uncompacted history, in offset order per task (key = task_id)
        spec = r.value
        if spec.status == "active":
            was_active.add(spec.task_id)
        elif spec.status == "retired":
            retired.add(spec.task_id)
    return {t for t in retired if t not in was_active}


def reward_batches(groups: dict[str, list[JudgedTrajectory]], config: RunConfig) -> list[RewardSampleBatch]:
    """The reward-model sample batch of each whole group, as signals publishes them."""
    return [build_samples(rid, groups[rid], config.signals)[1] for rid in sorted(groups)]


async def _starting_folder(bus: Bus, config: RunConfig, start: str) -> tuple[Path, int]:
    """(HF folder to start from, newest published reward version or -1)."""
    from infra.models import prepare_preset
    from infra.weights import WeightStore

    workdir = Path(config.workdir)
    published = [r.value for r in await bus.read_topic(topics.WEIGHTS) if r.value.model == "reward"]
    newest = max((w.version for w in published), default=-1)
    if start == "preset":
        return prepare_preset(config.reward_model, role="reward", workdir=workdir), newest
    if start == "latest" or (start.startswith("v") and start[1:].isdigit()):
        if not published:
            raise ValueError(f"--from {start}: no reward-model version has been published on this bus")
        wanted = newest if start == "latest" else int(start[1:])
        event = next((w for w in reversed(published) if w.version == wanted), None)
        if event is None:
            raise ValueError(
                f"--from {start}: published reward versions are {sorted({w.version for w in published})}"
            )
        store = WeightStore.for_run(config)
        return store.fetch(event), newest
    folder = Path(start)
    if not (folder / "config.json").is_file():
        raise ValueError(f"--from {start}: expected preset, latest, vN or a Hugging Face model folder")
    return folder, newest


def train_reward_model(
    folder: Path, batches: list[RewardSampleBatch], config: RunConfig, *, epochs: int, seed: int
) -> tuple[Any, Any, list[float], int]:
    """Train on the batches' samples (decoupled PPO, as the live reward learner), through the live
    learner's filter; returns (model, tokenizer, losses, samples it could not train)."""
    import torch

    from infra.models import load_trainable
    from learners.core import Trainer, reference_weights, to_train_samples
    from learners.engine import build_engine

    model_cfg = msgspec.structs.replace(config.reward_model, preset=f"hf:{folder}")
    torch.set_num_threads(model_cfg.torch_threads)
    torch.manual_seed(seed)
    model, tokenizer = load_trainable(model_cfg, role="reward", workdir=Path(config.workdir))
    model.eval()
    cfg = config.reward_learner
    # the reference KL anchors to the weights replay starts from
    reference = reference_weights(model_cfg, cfg, role="reward", workdir=Path(config.workdir))
    trainer = Trainer(build_engine(model, cfg), cfg, model_cfg.temperature, reference)
    vocab_size = int(model.get_input_embeddings().num_embeddings)
    train, invalid = [], 0
    for batch in batches:
        trainable, dropped = to_train_samples(batch, "reward_version", vocab_size)
        train += trainable
        invalid += dropped
    if not train:
        raise ValueError(f"none of the {invalid} reward-model samples can be trained by this model")
    rng = random.Random(seed)
    losses: list[float] = []
    # batch by batch as the live learner (proximal once per batch, minibatches, warm-up): one step
    # per minibatch with the proximal taken at each step never clipped, and 74 steps from the
    # preset left a model that answered `\-----` to every prompt
    for _ in range(epochs):
        rng.shuffle(train)
        for lo in range(0, len(train), cfg.batch_samples):
            steps = trainer.batch_steps(train[lo : lo + cfg.batch_samples], first_step=len(losses))
            losses += [stats.loss for _, _, stats in steps]
    return model, tokenizer, losses, invalid


async def replay(
    config: RunConfig,
    *,
    since: datetime,
    until: datetime,
    out: Path,
    train: bool = True,
    start_from: str = "preset",
    epochs: int = 1,
    publish: bool = False,
) -> ReplayResult:
    import anyio

    result = ReplayResult(started_from=start_from)
    since_ms, until_ms = int(since.timestamp() * 1000), int(until.timestamp() * 1000)
    if until_ms <= since_ms:
        raise ValueError(f"--until ({until.isoformat()}) must be after --since ({since.isoformat()})")
    out.mkdir(parents=True, exist_ok=True)
    async with Bus(config.kafka, role="replay") as bus:
        records = await bus.read_topic(topics.JUDGED)
        result.records_read = len(records)
        in_range = [r.value for r in records if since_ms <= r.timestamp_ms < until_ms]
        result.records_in_range = len(in_range)
        groups, result.groups_incomplete = complete_groups(in_range)
        result.groups_complete = len(groups)
        rejected = rejected_variants(await bus.read_topic(topics.TASKS, latest_per_key=False))
        groups = {rid: g for rid, g in groups.items() if g[0].trajectory.task.task_id not in rejected}
        result.groups_rejected_variant = result.groups_complete - len(groups)
        batches = reward_batches(groups, config)
        samples = [s for batch in batches for s in batch.samples]
        result.reward_samples = len(samples)
        (out / "reward_samples.msgpack").write_bytes(msgspec.msgpack.encode(samples))
        log.info("replay: %d records in range, %d whole groups, %d reward samples",
                 result.records_in_range, result.groups_complete, len(samples))  # fmt: skip
        if train:
            if not samples:
                raise ValueError("no reward-model samples in that time range: nothing to train on")
            folder, newest = await _starting_folder(bus, config, start_from)
            model, tokenizer, result.losses, result.samples_invalid = await anyio.to_thread.run_sync(
                lambda: train_reward_model(folder, batches, config, epochs=epochs, seed=config.seed)
            )
            result.optimizer_steps = len(result.losses)
            model_dir = out / "model"
            model.save_pretrained(str(model_dir), safe_serialization=True)
            tokenizer.save_pretrained(str(model_dir))
            result.model_dir = str(model_dir)
            if publish:
                from infra.weights import WeightStore

                store = WeightStore.for_run(config)
                version = newest + 1
                event = store.publish("reward", version, model, tokenizer, preset=f"replay:{start_from}")
                await bus.send(topics.WEIGHTS, event, key="reward")
                result.published_version = version
    (out / "replay.json").write_text(json.dumps(result.summary(), indent=2))
    return result
