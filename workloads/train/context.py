"""Where this process stands: decided ONCE from torchrun's environment, then consulted only here.

`init_context` reads RANK / LOCAL_RANK / WORLD_SIZE (set by torchrun), plans the run with
workloads.plan (the launcher's planner), pins CUDA *before* `init_process_group` (so NCCL binds
each rank to its own GPU) and returns one frozen `RunContext`. This module is the one place that
knows the wrappers (DataParallel, DistributedDataParallel, and through workloads.train.sharding
FSDP2's fully_shard and ZeRO-1's ZeroRedundancyOptimizer): `wrap_model` / `unwrap_model`,
`build_optimizer`, `sync_gradients` (gradient accumulation), `eval_model` and the full state
dicts of checkpoints (`model_state`, `optimizer_state` and their loaders). The training loop never
branches on the mode.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from workloads.config import PROCESS_GROUP_MODES, TrainConfig
from workloads.plan import Environment, Plan, plan, torchrun_layout
from workloads.train import sharding

__all__ = [
    "AutocastForward",
    "RunContext",
    "build_optimizer",
    "eval_model",
    "first_bucket_bytes",
    "init_context",
    "load_model_state",
    "load_optimizer_state",
    "model_state",
    "optimizer_state",
    "sync_gradients",
    "teardown",
    "unwrap_model",
    "wrap_model",
]


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """The process's place in the run (rank, device, world); identical semantics in every mode."""

    mode: str
    """single | dp | ddp | fsdp."""
    rank: int
    """Global rank (0 outside a process group)."""
    local_rank: int
    """Rank on this node; the CUDA device index under DDP."""
    world_size: int
    """Number of processes (1 for single and DP)."""
    local_world_size: int
    """Processes on this node (torchrun --nproc-per-node)."""
    device: torch.device
    """Where this process's batch and (primary) replica live."""
    devices: tuple[torch.device, ...]
    """Every device this process computes on (DP: all its GPUs)."""
    plan: Plan
    """The run's layout (workloads.plan): replicas, batch split, threads, every rank's device."""

    @property
    def process_group(self) -> bool:
        """The ranks are processes of one process group (ddp, fsdp): collectives apply."""
        return self.mode in PROCESS_GROUP_MODES

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the run record and checkpoints."""
        return self.rank == 0

    @property
    def replicas(self) -> int:
        """Model replicas the global batch is split over (DDP ranks or DP GPUs)."""
        return self.plan.replicas or 1

    @property
    def backend(self) -> str:
        """nccl | gloo for DDP, none otherwise."""
        return self.plan.backend

    @property
    def nnodes(self) -> int:
        """Nodes in the job."""
        return self.plan.nnodes

    def gather_to_main(self, obj: Any) -> list[Any] | None:
        """Collective in a process group: every rank's `obj`, in rank order, on rank 0 (None on
        the others); outside one just [obj]."""
        if not self.process_group:
            return [obj]
        gathered = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, gathered, dst=0)
        return gathered


def init_context(cfg: TrainConfig) -> RunContext:
    """Plan the run from the environment (workloads.plan, as the launcher did), pin the device and
    join the process group for DDP and FSDP. Raises ValueError when the plan says this cannot run
    here."""
    group = cfg.mode in PROCESS_GROUP_MODES
    if group:
        missing = [k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if k not in os.environ]
        if missing:
            raise ValueError(
                f"--mode {cfg.mode} needs torchrun's {', '.join(missing)}; start it with "
                f"`python -m workloads.launch --mode {cfg.mode} ...` (or torchrun -m "
                "workloads.train)"
            )
        global_rank = int(os.environ["RANK"])
        local_rank = int(os.environ["LOCAL_RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    else:
        global_rank = local_rank = 0
        world_size = local_world = 1
    run_plan = plan(cfg, Environment.detect(), **torchrun_layout(cfg.mode))
    if run_plan.reason:
        raise ValueError(run_plan.reason)
    assert run_plan.devices is not None
    if group:
        devices = (torch.device(run_plan.devices[global_rank]),)
    else:  # single: one device; DP: every GPU it spreads over, the batch lands on the first
        devices = tuple(torch.device(d) for d in run_plan.devices)
    if run_plan.use_cuda:
        # Before init_process_group: NCCL creates its communicator on the current device.
        torch.cuda.set_device(devices[0])
    if group:
        kwargs: dict = {
            "backend": run_plan.backend,
            "timeout": timedelta(seconds=cfg.collective_timeout),
        }
        if cfg.init_method:
            # file:// (or tcp://) rendezvous: rank and world size must be given explicitly.
            kwargs.update(init_method=cfg.init_method, rank=global_rank, world_size=world_size)
        elif int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0):
            # A restarted attempt shares torchrun's store with the attempts before it, whose
            # stale gloo/NCCL addresses would be read back: give this attempt a key space of its own.
            store, _, _ = next(dist.rendezvous("env://", timeout=kwargs["timeout"]))
            prefix = f"/dpscope/attempt{os.environ['TORCHELASTIC_RESTART_COUNT']}"
            kwargs.update(
                store=dist.PrefixStore(prefix, store), rank=global_rank, world_size=world_size
            )
        dist.init_process_group(**kwargs)
    return RunContext(
        mode=cfg.mode,
        rank=global_rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world,
        device=devices[0],
        devices=devices,
        plan=run_plan,
    )


def teardown() -> None:
    """Leave the process group (if any) so NCCL/gloo shut down cleanly."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _register_comm_hook(model: DistributedDataParallel, hook: str) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif hook == "powersgd":
        # Rank-1 PowerSGD; plain allreduce for the first 2 steps (PowerSGD needs >= 2 to warm up
        # its error feedback), so a short profiled run still sees the compressed path.
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


class AutocastForward(nn.Module):
    """Runs the wrapped module's forward under `torch.autocast(device_type, dtype)` in whichever
    thread calls it.

    DataParallel runs each replica's forward in its own thread and re-enters autocast there with
    the thread's *default* dtype (float16 on CUDA): the autocast dtype is thread-local, so the
    caller's bf16 would silently become fp16 on more than one GPU. Autocasting inside forward is
    the documented fix; it is a no-op where the caller's autocast already matches.
    """

    def __init__(self, module: nn.Module, *, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module
        self.device_type = device_type
        self.dtype = dtype

    def forward(self, *args, **kwargs):
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.module(*args, **kwargs)


def first_bucket_bytes(bucket_cap_mb: float) -> int:
    """The size limit of DDP's first bucket (the last gradients to become ready) when it is given
    `bucket_cap_mb` explicitly, as `wrap_model` does: `bucket_cap_mb` itself since torch's
    bucket-capacity config (an explicit cap turns off the 1 MiB first bucket), 1 MiB
    (`_DEFAULT_FIRST_BUCKET_BYTES`) before it. run.json records it (config.ddp) so that the
    projection assigns a single run's gradients to buckets as DDP would."""
    from torch.nn.parallel import distributed as ddp_module

    config = getattr(ddp_module, "_BucketCapacityConfig", None)
    try:
        return int(config.create(bucket_cap_mb, None, False).first_bucket_bytes_cap)
    except (AttributeError, TypeError):  # an older torch (or a changed private API)
        return int(dist._DEFAULT_FIRST_BUCKET_BYTES)


def wrap_model(model: nn.Module, ctx: RunContext, cfg: TrainConfig) -> nn.Module:
    """Move `model` to the context's device and wrap it for the mode (the one place that does)."""
    if ctx.mode == "ddp" and cfg.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(ctx.device)
    if ctx.mode == "dp":
        if cfg.amp != "none":
            dtype = torch.bfloat16 if cfg.amp == "bf16" else torch.float16
            model = AutocastForward(model, device_type=ctx.device.type, dtype=dtype)
        return DataParallel(model, device_ids=[d.index for d in ctx.devices])
    if ctx.mode == "fsdp":
        return sharding.shard_model(model, cfg)[0]
    if ctx.mode == "ddp":
        ddp = DistributedDataParallel(
            model,
            device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None,
            bucket_cap_mb=cfg.bucket_cap_mb,
            gradient_as_bucket_view=cfg.gradient_as_bucket_view,
            static_graph=cfg.static_graph,
            find_unused_parameters=cfg.find_unused_parameters,
        )
        _register_comm_hook(ddp, cfg.comm_hook)
        return ddp
    return model


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside a DataParallel / DDP wrapper (what model facts read; an FSDP2
    model is its own module, its parameters sharded)."""
    while isinstance(model, DataParallel | DistributedDataParallel | AutocastForward):
        model = model.module
    return model


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The run's SGD over the wrapped model's parameters (FSDP: its shards), inside a
    ZeroRedundancyOptimizer for --zero 1."""
    return sharding.sgd(model.parameters(), cfg, zero=cfg.zero == 1)


def sync_gradients(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager[None]:
    """Gradient accumulation: a backward inside this context communicates its gradients only
    when `enabled` (DDP: no_sync otherwise; FSDP2: no reduce-scatter until the last)."""
    if enabled:
        return contextlib.nullcontext()
    if isinstance(model, DistributedDataParallel):
        return model.no_sync()
    return sharding.gradient_sync(model, enabled)


def eval_model(model: nn.Module, ctx: RunContext) -> nn.Module:
    """Collective for FSDP: the module an evaluation runs (a plain replica with the full
    weights, workloads.train.sharding.eval_replica); the unwrapped module otherwise."""
    if sharding.is_fsdp(model):
        return sharding.eval_replica(model, ctx.device)
    return unwrap_model(model)


def model_state(model: nn.Module, ctx: RunContext) -> dict | None:
    """Collective for FSDP: the full model state dict on rank 0 (None on the others), as a
    checkpoint or final.pt holds it."""
    if sharding.is_fsdp(model):
        state = sharding.full_model_state(model)
        return state if ctx.is_main else None
    return unwrap_model(model).state_dict() if ctx.is_main else None


def optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, ctx: RunContext
) -> dict | None:
    """Collective for FSDP and ZeRO-1: the full optimizer state dict on rank 0 (None on the
    others)."""
    if sharding.is_fsdp(model) or sharding.is_zero(optimizer):
        state = sharding.full_optimizer_state(model, optimizer)
        return state if ctx.is_main else None
    return optimizer.state_dict() if ctx.is_main else None


def load_model_state(model: nn.Module, state: dict) -> None:
    """Load a checkpoint's full model state dict (every rank)."""
    if sharding.is_fsdp(model):
        sharding.load_model_state(model, state)
    else:
        unwrap_model(model).load_state_dict(state)


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a checkpoint's full optimizer state dict (every rank)."""
    sharding.load_optimizer_state(model, optimizer, state)
