"""What one training run trains with: data, sampler, loaders, model, loss, optimizer, GradScaler.

Built once per rank by `build_components` from the config's specs (workloads.train.workload), with the
seed set before the dataset and the model factories so every mode and every rank starts from the
same data and the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader

from workloads.config import EVAL_BATCH, TrainConfig
from workloads.train.context import RunContext, build_optimizer, wrap_model
from workloads.train.data import GlobalBatchSampler, eval_loader, train_loader
from workloads.train.losses import LossFn, build_loss
from workloads.train.workload import WorkloadFacts, build_data, build_network, describe

__all__ = ["Components", "build_components", "planned_steps"]


@dataclass(kw_only=True)
class Components:
    """What one run trains with, built once by `build_components`."""

    sampler: GlobalBatchSampler
    loader: DataLoader
    test_loader: DataLoader | None
    """None: the dataset has no test split, so the run has no eval."""
    model: nn.Module
    loss_fn: LossFn
    facts: WorkloadFacts
    """What run.json records of the model and one batch (config.model_facts)."""
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    amp: torch.dtype | None


def build_components(cfg: TrainConfig, ctx: RunContext) -> Components:
    """Data, sampler, model (seeded, wrapped for the mode), loss, optimizer (ZeRO-1 for --zero 1)
    and GradScaler."""
    data = build_data(cfg)
    assert ctx.plan.global_batch is not None  # init_context refuses a plan that cannot run
    # DP is one replica of the sampler (DataParallel splits the batch itself); DDP and FSDP ranks
    # take shares.
    sampler = GlobalBatchSampler(
        num_samples=len(data.train),
        global_batch=ctx.plan.global_batch,
        rank=ctx.rank,
        replicas=ctx.world_size,
        seed=cfg.seed,
    )
    loaders = {"num_workers": cfg.num_workers, "pin_memory": cfg.pin_memory}
    net = build_network(cfg, data)  # seeded: the same initial weights in every mode and rank
    facts = describe(net, data)
    model = wrap_model(net, ctx, cfg)
    test = data.test
    return Components(
        sampler=sampler,
        loader=train_loader(data.train, sampler, **loaders),
        test_loader=None
        if test is None
        else eval_loader(
            test,
            rank=ctx.rank,
            world_size=ctx.world_size,
            batch_size=EVAL_BATCH,
            max_samples=cfg.eval_batches * EVAL_BATCH,
            **loaders,
        ),
        model=model,
        loss_fn=build_loss(cfg.loss_spec()),
        facts=facts,
        optimizer=build_optimizer(model, cfg),
        scaler=torch.amp.GradScaler(
            ctx.device.type, enabled=ctx.device.type == "cuda" and cfg.amp == "fp16"
        ),
        amp={"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.amp),
    )


def planned_steps(cfg: TrainConfig, components: Components) -> int:
    """Optimizer steps the run makes: every epoch's, capped by `--max-steps`."""
    planned = cfg.epochs * len(components.sampler)
    return min(planned, cfg.max_steps) if cfg.max_steps else planned
