"""Checkpoints: the loop state, each rank's RNG, and rank-0 atomic saves; resuming from them.

Everything the loop needs to continue after a restart (epoch, step, sampler position, eval
history, the step rows written so far) lives in one `LoopState`, saved next to the model,
optimizer and GradScaler state and every rank's RNG states (torch, numpy, python), so a job
that torchrun restarts (`--max-restarts`) resumes from the last checkpoint exactly where it was.
Every value in the file loads under `torch.load(..., weights_only=True)`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from profiler.callbacks import Callback, StepState
from profiler.runfolder.atomic import atomic_path
from workloads.train.context import (
    RunContext,
    load_model_state,
    load_optimizer_state,
    model_state,
    optimizer_state,
)

__all__ = [
    "LoopState",
    "SaveFinal",
    "capture_rng",
    "checkpoint_now",
    "load_checkpoint",
    "restore_rng",
    "resume",
    "save_checkpoint",
    "save_final",
]


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
    epoch_times: list[float] = field(default_factory=list)
    """Wall time of each finished training epoch (s)."""
    rows: list[dict] = field(default_factory=list)
    """Rank 0 only: every rank's steps.csv rows up to the last checkpoint."""

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "epoch_step": self.epoch_step,
            # Plain strings load under weights_only=True (NaN-safe, any nesting).
            "evals": json.dumps(self.evals),
            "epoch_times": json.dumps(self.epoch_times),
            "rows": json.dumps(self.rows),
        }

    def load_state_dict(self, sd: dict) -> None:
        self.epoch, self.step, self.epoch_step = sd["epoch"], sd["step"], sd["epoch_step"]
        self.evals = json.loads(sd["evals"])
        self.epoch_times = json.loads(sd.get("epoch_times", "[]"))
        self.rows = json.loads(sd.get("rows", "[]"))


def capture_rng() -> dict:
    """This process's torch, numpy and python RNG states as weights_only-loadable values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": random.getstate(),
    }


def restore_rng(rng: dict) -> None:
    """Inverse of capture_rng."""
    torch.set_rng_state(rng["torch"])
    n = rng["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["gauss"]))
    version, internal, gauss_next = rng["python"]
    random.setstate((version, tuple(internal), gauss_next))


def _atomic_save(payload: dict, path: Path) -> None:
    with atomic_path(path) as tmp:  # readers (a restarted job) never see a half-written file
        torch.save(payload, tmp)


def save_checkpoint(
    path: Path,
    model: dict,
    optimizer: dict,
    state: LoopState,
    *,
    scaler: torch.amp.GradScaler | None = None,
    rng: list[dict] | None = None,
) -> None:
    """Rank 0 only: {model: full state_dict, optimizer: full state_dict, scaler, loop, rng: [per
    rank]}, written atomically (the state dicts as context.model_state / optimizer_state give
    them)."""
    payload = {
        "model": model,
        "optimizer": optimizer,
        "scaler": scaler.state_dict() if scaler is not None else {},
        "loop": state.state_dict(),
        "rng": rng if rng is not None else [capture_rng()],
    }
    _atomic_save(payload, path)


def checkpoint_now(
    path: Path,
    ctx: RunContext,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    state: LoopState,
    pending: list[dict],
) -> None:
    """Collective in a process group: every rank hands its RNG states and its step rows since
    the last checkpoint to rank 0 (and, for FSDP and ZeRO-1, its shards of the model and
    optimizer state), which folds the rows into `state.rows` and writes one consistent file.
    `pending` is emptied on every rank (its rows now live in the checkpoint)."""
    weights, opt = model_state(model, ctx), optimizer_state(model, optimizer, ctx)
    gathered = ctx.gather_to_main({"rng": capture_rng(), "rows": list(pending)})
    pending.clear()
    if gathered is None or weights is None or opt is None:  # not rank 0
        return
    state.rows.extend(r for g in gathered for r in g["rows"])
    save_checkpoint(path, weights, opt, state, scaler=scaler, rng=[g["rng"] for g in gathered])


def resume(
    path: Path,
    ctx: RunContext,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    state: LoopState,
    *,
    attempt_no: int,
) -> bool:
    """Load `path` into model, optimizer, scaler, loop state and this rank's RNG; False when
    there is no checkpoint (the attempt then starts from step 0). Rank 0 notes where the
    attempt resumed (logs/attempt<k>.json, read back into run.json `resumes`)."""
    from workloads.launch.faults import write_attempt

    sd = load_checkpoint(path) if path.is_file() else None
    if ctx.is_main:
        resumed_from = sd["loop"]["step"] if sd else 0
        write_attempt(path.parent, attempt_no=attempt_no, resumed_from_step=resumed_from)
    if sd is None:
        return False
    load_model_state(model, sd["model"])
    load_optimizer_state(model, optimizer, sd["optimizer"])
    if sd.get("scaler"):
        scaler.load_state_dict(sd["scaler"])
    state.load_state_dict(sd["loop"])
    if not ctx.is_main:
        state.rows = []  # only rank 0 carries the rows to steps.csv
    rngs = sd.get("rng") or []
    if len(rngs) != ctx.world_size:
        raise ValueError(
            f"{path} holds RNG states of {len(rngs)} ranks but this job has {ctx.world_size}; "
            "resume with the same world size or remove the checkpoint"
        )
    restore_rng(rngs[ctx.rank])
    return True


def save_final(path: Path, model: nn.Module, ctx: RunContext) -> None:
    """final.pt: the model's full state_dict (collective for FSDP; rank 0 writes it atomically;
    loads with weights_only=True)."""
    state = model_state(model, ctx)
    if state is not None:
        _atomic_save(state, path)


class SaveFinal(Callback):
    """`--save-final`: final.pt at `run_end`, once the profiler and the memory sampler have
    stopped (so the save is in no trace) and before the run record. On rank 0, and on every rank
    of an FSDP run (its full state dict is a collective)."""

    def __init__(self, path: Path, ctx: RunContext) -> None:
        self.path = path
        self.ctx = ctx

    def run_end(self, state: StepState) -> None:
        save_final(self.path, state.model, self.ctx)


def load_checkpoint(path: Path) -> dict:
    """Load a checkpoint safely (weights_only=True: tensors and plain containers, no pickled code)."""
    return torch.load(path, map_location="cpu", weights_only=True)
