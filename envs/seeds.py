"""Task seeds: training and held-out evaluation draw from disjoint ranges.

Every task is `env.sample_task(level, random.Random(seed))` for an integer seed:
- training (scheduler seeding, bootstrap SFT, tokenizer corpus) draws seeds in
  [0, HELDOUT_BASE) through `training_rng`;
- held-out evaluation uses seed HELDOUT_BASE + level · LEVEL_STRIDE + i for its i-th task of a
  level (`heldout_rng`), so the held-out set is fixed, reproducible and never drawn in training.
Disjoint seeds are not disjoint worlds: the easiest levels have few distinct worlds, so an
evaluation also reports how many of its tasks share a signature with a training sample.
"""

from __future__ import annotations

import random

HELDOUT_BASE = 1 << 62
"""First held-out seed; training seeds are all below it."""
LEVEL_STRIDE = 1 << 32
"""Held-out seeds of one level: HELDOUT_BASE + level · LEVEL_STRIDE + [0, LEVEL_STRIDE)."""


def training_seed(rng: random.Random) -> int:
    """A task seed for training, below HELDOUT_BASE."""
    return rng.randrange(HELDOUT_BASE)


def training_rng(rng: random.Random) -> random.Random:
    """The generator one training task is sampled from (seeded in the training range)."""
    return random.Random(training_seed(rng))


def heldout_seed(level: int, index: int) -> int:
    """The seed of the `index`-th held-out task of `level`."""
    if not 0 <= index < LEVEL_STRIDE or level < 0:
        raise ValueError(f"held-out task {index} of level {level} is outside the documented range")
    return HELDOUT_BASE + level * LEVEL_STRIDE + index


def heldout_rng(level: int, index: int) -> random.Random:
    return random.Random(heldout_seed(level, index))


def is_heldout(seed: int) -> bool:
    return seed >= HELDOUT_BASE
