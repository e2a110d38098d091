"""Training engines behind one interface: plain torch AdamW, and DeepSpeed ZeRO (stage 0-3).

The learner loop calls `module(...)` for forward passes, `backward(loss)` once per micro-batch
and `step()` once per optimizer step, so a variable number of micro-batches per step works with
both engines. Both run the same optimizer (torch AdamW with the LearnerConfig hyper-parameters,
grad-norm clipping) on the same batches, so their losses agree within float error
(tests/test_deepspeed.py states the tolerance).

Invariant: optimizer state is exported per named trainable parameter (exp_avg, exp_avg_sq, plus
the step count) whatever the engine or ZeRO partitioning, so checkpoints are plain safetensors and
move between engines.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from schemas.config import LearnerConfig

PROJECT_ROOT = Path(__file__).resolve().parents[1]
MOMENT_KEYS = ("exp_avg", "exp_avg_sq")


class Engine(Protocol):
    module: nn.Module  # call this for forward passes (may wrap `model`)
    model: nn.Module  # the bare (possibly peft-wrapped) model: what checkpoints and publishes see
    rank: int
    world_size: int

    def backward(self, loss: Tensor) -> None: ...
    def step(self) -> float:
        """Clip, update, zero the gradients; returns the global grad norm before clipping."""
        ...

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next step (warm-up)."""
        ...

    def optimizer_state(self) -> tuple[dict[str, Tensor], int]:
        """Full (unpartitioned) moments keyed `<param name>::<moment>`, and the step count."""
        ...

    def load_optimizer_state(self, tensors: dict[str, Tensor], step: int) -> None: ...
    def full_parameters(self) -> contextlib.AbstractContextManager[None]:
        """Context in which `model`'s parameters are whole (ZeRO-3 gathers them)."""
        ...


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def make_optimizer(params: list[nn.Parameter], cfg: LearnerConfig) -> torch.optim.AdamW:
    # foreach=False: the same per-tensor kernel whether params are separate (torch) or flat (ZeRO)
    return torch.optim.AdamW(
        params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, eps=1e-8, foreach=False
    )


class TorchEngine:
    """Single-process AdamW with global grad-norm clipping."""

    rank = 0
    world_size = 1

    def __init__(self, model: nn.Module, cfg: LearnerConfig) -> None:
        self.model = self.module = model
        self.named = trainable_parameters(model)
        self.params = [p for _, p in self.named]
        self.optimizer = make_optimizer(self.params, cfg)
        self.grad_clip = cfg.grad_clip

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def set_lr(self, lr: float) -> None:
        _set_lr(self.optimizer, lr)

    def step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def optimizer_state(self) -> tuple[dict[str, Tensor], int]:
        return _torch_optimizer_state(self.optimizer, self.named)

    def load_optimizer_state(self, tensors: dict[str, Tensor], step: int) -> None:
        _load_torch_optimizer_state(self.optimizer, self.named, tensors, step)

    def full_parameters(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _torch_optimizer_state(
    optimizer: torch.optim.Optimizer, named: list[tuple[str, nn.Parameter]]
) -> tuple[dict[str, Tensor], int]:
    tensors: dict[str, Tensor] = {}
    step = 0
    for name, p in named:
        state = optimizer.state.get(p)
        if not state:
            continue
        step = max(step, int(state["step"]))
        for key in MOMENT_KEYS:
            tensors[f"{name}::{key}"] = state[key].detach().float().clone()
    return tensors, step


def _load_torch_optimizer_state(
    optimizer: torch.optim.Optimizer,
    named: list[tuple[str, nn.Parameter]],
    tensors: dict[str, Tensor],
    step: int,
) -> None:
    for name, p in named:
        if f"{name}::exp_avg" not in tensors:
            continue
        optimizer.state[p] = {
            "step": torch.tensor(float(step)),
            **{k: tensors[f"{name}::{k}"].to(p.dtype).clone() for k in MOMENT_KEYS},
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> None:
    """Join torchrun's process group, or make a one-process group when run standalone."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(PROJECT_ROOT / ".cache" / "torch_extensions"))
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())
        )
    import deepspeed

    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo", verbose=False)


class DeepSpeedEngine:
    """DeepSpeed with torch's AdamW as client optimizer (CPU accelerator here, CUDA where present).

    The caller owns the accumulation boundary (`managed_gradient_accumulation: false`): every
    `backward` accumulates, every `step` reduces, clips and updates — the same contract as TorchEngine.
    """

    def __init__(self, model: nn.Module, cfg: LearnerConfig) -> None:
        init_distributed()
        import deepspeed

        self.zero_stage = cfg.zero_stage
        self.model = model
        named = trainable_parameters(model)
        ds_config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,
            "gradient_clipping": cfg.grad_clip,
            "zero_optimization": {"stage": cfg.zero_stage},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 1 << 62,
            "wall_clock_breakdown": False,
        }
        optimizer = make_optimizer([p for _, p in named], cfg)
        self.ds, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=ds_config
        )
        self.module = self.ds
        self.named = trainable_parameters(model)
        self.rank = torch.distributed.get_rank()
        self.world_size = torch.distributed.get_world_size()

    @property
    def base_optimizer(self) -> torch.optim.Optimizer:
        return getattr(self.optimizer, "optimizer", self.optimizer)

    @property
    def partitioned(self) -> bool:
        p = self.named[0][1]
        return hasattr(p, "_hp_mapping") or hasattr(p, "ds_id")

    def backward(self, loss: Tensor) -> None:
        self.ds.backward(loss, scale_wrt_gas=False)

    def set_lr(self, lr: float) -> None:
        _set_lr(self.base_optimizer, lr)

    def step(self) -> float:
        self.ds.step()
        norm = self.ds.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0

    def _step_count(self) -> int:
        return max((int(s["step"]) for s in self.base_optimizer.state.values() if "step" in s), default=0)

    def optimizer_state(self) -> tuple[dict[str, Tensor], int]:
        if not self.partitioned:
            return _torch_optimizer_state(self.base_optimizer, self.named)
        step = self._step_count()
        if step == 0:
            return {}, 0
        from deepspeed.utils import safe_get_full_optimizer_state

        tensors = {
            f"{name}::{key}": safe_get_full_optimizer_state(p, key).detach().float().clone()
            for name, p in self.named
            for key in MOMENT_KEYS
        }
        return tensors, step

    def load_optimizer_state(self, tensors: dict[str, Tensor], step: int) -> None:
        if not tensors:
            return
        if not self.partitioned:
            _load_torch_optimizer_state(self.base_optimizer, self.named, tensors, step)
            return
        from deepspeed.utils import safe_set_full_optimizer_state

        if self._step_count() == 0:
            self._materialise_optimizer_state()
        for name, p in self.named:
            for key in MOMENT_KEYS:
                safe_set_full_optimizer_state(p, tensors[f"{name}::{key}"], key)
        for state in self.base_optimizer.state.values():
            state["step"] = torch.tensor(float(step))

    def _materialise_optimizer_state(self) -> None:
        """ZeRO creates its optimizer state on the first step: take one that changes nothing
        (zero gradients, lr 0) so the restored moments have somewhere to go."""
        groups = self.base_optimizer.param_groups
        saved = [g["lr"] for g in groups]
        for g in groups:
            g["lr"] = 0.0
        device = next(self.ds.parameters()).device
        out = self.ds(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device))
        self.backward(out.logits.sum() * 0.0)
        self.ds.step()
        for g, lr in zip(groups, saved, strict=True):
            g["lr"] = lr

    def full_parameters(self) -> contextlib.AbstractContextManager[None]:
        if self.zero_stage < 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None)


def build_engine(model: nn.Module, cfg: LearnerConfig) -> Engine:
    if cfg.engine == "deepspeed":
        return DeepSpeedEngine(model, cfg)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # every rank would think itself rank 0: each reading Kafka, each publishing
        raise ValueError(f"engine {cfg.engine!r} trains in one process, but this is one of {world} ranks: "
                         "set the learner's engine = \"deepspeed\"")  # fmt: skip
    return TorchEngine(model, cfg)
