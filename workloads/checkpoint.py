"""Checkpoints: the loop state, and rank-0 atomic saves of the unwrapped model.

Everything the loop needs to continue after a restart (epoch, step, sampler position, eval
history, RNG) lives in one `LoopState`, saved next to the model and optimizer state, so a future
`torchrun --max-restarts` run can resume from the last checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from profiler.atomic import atomic_path
from workloads.context import unwrap_model

__all__ = ["LoopState", "load_checkpoint", "save_checkpoint"]


@dataclass(kw_only=True)
class LoopState:
    """Where the loop is; everything a resumed run needs besides model and optimizer state."""

    epoch: int = 0
    """Current epoch (0-based)."""
    step: int = 0
    """Optimizer steps done over the whole run."""
    epoch_step: int = 0
    """Optimizer steps done in the current epoch (the sampler's position)."""
    evals: list[dict] = field(default_factory=list)
    """Eval results of finished epochs."""

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "epoch_step": self.epoch_step,
            "evals": json.dumps(self.evals),  # a plain string loads under weights_only=True
            "rng_cpu": torch.get_rng_state(),
        }

    def load_state_dict(self, sd: dict) -> None:
        self.epoch, self.step, self.epoch_step = sd["epoch"], sd["step"], sd["epoch_step"]
        self.evals = json.loads(sd["evals"])
        torch.set_rng_state(sd["rng_cpu"])


def save_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: LoopState
) -> None:
    """Rank 0 only: {model: unwrapped state_dict, optimizer, loop}, written atomically."""
    payload = {
        "model": unwrap_model(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "loop": state.state_dict(),
    }
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(path: Path) -> dict:
    """Load a checkpoint safely (weights_only=True: tensors and plain containers, no pickled code)."""
    return torch.load(path, map_location="cpu", weights_only=True)
