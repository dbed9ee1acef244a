"""What one training run trains with: data, sampler, loaders, model, optimizer, GradScaler.

Built once per rank by `build_parts`, with the seed set before the model so every mode and every
rank starts from the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader

from workloads.config import TrainConfig
from workloads.train.context import RunContext, wrap_model
from workloads.train.data import GlobalBatchSampler, build_datasets, eval_loader, train_loader
from workloads.train.models import build_model

__all__ = ["Parts", "build_parts", "planned_steps"]


@dataclass(kw_only=True)
class Parts:
    """What one run trains with, built once by `build_parts`."""

    sampler: GlobalBatchSampler
    loader: DataLoader
    test_loader: DataLoader
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    amp: torch.dtype | None


def build_parts(cfg: TrainConfig, ctx: RunContext) -> Parts:
    """Data, sampler, model (seeded, wrapped for the mode), optimizer and GradScaler."""
    data = build_datasets(cfg.dataset, cfg.data_dir, download=cfg.download)
    assert ctx.plan.global_batch is not None  # init_context refuses a plan that cannot run
    # DP is one replica of the sampler (DataParallel splits the batch itself); DDP ranks take shares.
    sampler = GlobalBatchSampler(
        num_samples=len(data.train),
        global_batch=ctx.plan.global_batch,
        rank=ctx.rank,
        replicas=ctx.world_size,
        seed=cfg.seed,
    )
    loaders = {"num_workers": cfg.num_workers, "pin_memory": cfg.pin_memory}
    torch.manual_seed(cfg.seed)  # the same initial weights in every mode and on every rank
    model = wrap_model(build_model(cfg.model, num_classes=data.num_classes), ctx, cfg)
    return Parts(
        sampler=sampler,
        loader=train_loader(data.train, sampler, **loaders),
        test_loader=eval_loader(
            data.test, rank=ctx.rank, world_size=ctx.world_size, batch_size=256, **loaders
        ),
        model=model,
        optimizer=torch.optim.SGD(
            model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        ),
        scaler=torch.amp.GradScaler(
            ctx.device.type, enabled=ctx.device.type == "cuda" and cfg.amp == "fp16"
        ),
        amp={"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.amp),
    )


def planned_steps(cfg: TrainConfig, parts: Parts) -> int:
    """Optimizer steps the run makes: every epoch's, capped by `--max-steps`."""
    planned = cfg.epochs * len(parts.sampler)
    return min(planned, cfg.max_steps) if cfg.max_steps else planned
