"""What a run will use: devices, replicas, threads and batch, decided by one function.

`plan(cfg, environment)` is shared by the launcher (before anything starts, so an impossible
request is one line, or a `skipped` record under `--mode all`) and by every training process
(which re-plans from torchrun's layout and its own view of the machine), so the two cannot
disagree about which devices a mode uses, how many replicas share the global batch, or how many
threads a CPU rank gets. `Environment` is the machine as torch sees it; tests build one by hand.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from workloads.config import PROCESS_GROUP_MODES, TrainConfig

__all__ = [
    "Environment",
    "Plan",
    "batch_split",
    "check_machine",
    "check_threads",
    "cpu_cores",
    "plan",
    "resolve_backend",
    "runnable_plan",
    "torchrun_layout",
]


def cpu_cores() -> int:
    """CPU cores this process may run on (affinity-aware where the OS tells us)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def batch_split(cfg: TrainConfig, replicas: int) -> tuple[int, int]:
    """(global_batch, per_device_batch) for `replicas` model replicas (DDP ranks or DP GPUs).

    Strong scaling keeps the global batch, so each device gets global / replicas; weak scaling
    keeps the per-device batch, so the global batch grows with the replicas. Both are per
    optimizer step: with --grad-accum-steps K each device's share is K micro-batches of
    per_device_batch / K, which must divide evenly.
    """
    if cfg.scaling == "weak":
        global_batch, per_device = cfg.batch_size * replicas, cfg.batch_size
    elif cfg.batch_size % replicas:
        raise ValueError(
            f"--batch-size {cfg.batch_size} (global, --scaling strong) is not divisible by "
            f"{replicas} devices; pick a multiple of {replicas} or use --scaling weak"
        )
    else:
        global_batch, per_device = cfg.batch_size, cfg.batch_size // replicas
    if per_device % cfg.grad_accum_steps:
        multiple = cfg.grad_accum_steps * (1 if cfg.scaling == "weak" else replicas)
        raise ValueError(
            f"--grad-accum-steps {cfg.grad_accum_steps} does not divide the per-device batch "
            f"{per_device} ({replicas} devices, --scaling {cfg.scaling}); pick a --batch-size "
            f"that is a multiple of {multiple}"
        )
    return global_batch, per_device


@dataclass(frozen=True, kw_only=True)
class Environment:
    """The machine as this process sees it."""

    system: str
    """platform.system(): Linux | Windows | Darwin."""
    cuda: bool
    """torch.cuda.is_available()."""
    gpus: int
    """Visible CUDA devices (0 without CUDA)."""
    nccl: bool
    """This torch build has NCCL."""
    cpu_cores: int
    """Cores this process may run on."""
    torch_threads: int
    """torch.get_num_threads() here: what a GPU rank keeps."""

    @classmethod
    def detect(cls) -> Environment:
        """Look the machine up now (not at import, so a patched platform or torch is seen)."""
        cuda = torch.cuda.is_available()
        return cls(
            system=platform.system(),
            cuda=cuda,
            gpus=torch.cuda.device_count() if cuda else 0,
            nccl=dist.is_available() and dist.is_nccl_available(),
            cpu_cores=cpu_cores(),
            torch_threads=torch.get_num_threads(),
        )


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A run as it will be laid out. `reason` says why it cannot run here; the fields it could
    not decide are then None (a skipped run's record carries them as null)."""

    mode: str
    backend: str
    """nccl | gloo for ddp, none otherwise (the requested backend when ddp cannot run)."""
    nnodes: int
    nproc: int | None
    """Processes per node (1 for single and DP)."""
    replicas: int | None
    """Model replicas over the whole job: DDP ranks, DP GPUs, or 1 (run.json world_size)."""
    devices: list[str] | None
    """One per replica, in rank order, e.g. ["cuda:0", "cuda:1"] or ["cpu", "cpu"]."""
    global_batch: int | None
    per_device_batch: int | None
    threads_per_rank: int | None
    """`--threads N`, else CPU ranks split the cores (cores // processes per node) and GPU ranks
    keep torch's default."""
    reason: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def use_cuda(self) -> bool:
        return bool(self.devices) and self.devices[0].startswith("cuda")


def torchrun_layout(mode: str, environ: Mapping[str, str] = os.environ) -> dict[str, int]:
    """`plan`'s nproc/nnodes for a training process: the torchrun job it belongs to (DDP, FSDP),
    {} otherwise (single and DP run in one process)."""
    if mode not in PROCESS_GROUP_MODES or "WORLD_SIZE" not in environ:
        return {}
    world = int(environ["WORLD_SIZE"])
    local = int(environ.get("LOCAL_WORLD_SIZE", world))
    return {"nproc": local, "nnodes": max(1, world // max(1, local))}


def resolve_backend(requested: str, *, use_cuda: bool, system: str | None = None) -> str:
    """`auto` is nccl on Linux with CUDA devices and gloo otherwise (CPU, Windows, macOS)."""
    if requested != "auto":
        return requested
    return "nccl" if use_cuda and (system or platform.system()) == "Linux" else "gloo"


def _check(cfg: TrainConfig, env: Environment, backend: str, count: int, flag: str) -> str | None:
    """Why `cfg` cannot run on `env` with `count` devices per node (None: it can)."""
    if cfg.device == "cuda" and not env.cuda:
        return "--device cuda but torch sees no CUDA device; use --device cpu or auto"
    use_cuda = cfg.device != "cpu" and env.cuda
    if cfg.mode == "dp" and not use_cuda:
        return (
            "--mode dp needs at least one CUDA device (nn.DataParallel is GPU-only) and none is "
            "visible; use --mode single, or --mode ddp --backend gloo on CPU"
        )
    if backend == "nccl" and env.system == "Windows":
        return "NCCL is not available on Windows; use --backend gloo (what auto picks there)"
    if backend == "nccl" and not use_cuda:
        return "--backend nccl needs CUDA GPUs and torch sees none; use --backend gloo (or auto)"
    if backend == "nccl" and not env.nccl:
        return "this torch build has no NCCL; use --backend gloo"
    if use_cuda and count > env.gpus:
        one_per_gpu = (
            " (one process per GPU), or --device cpu" if cfg.mode in PROCESS_GROUP_MODES else ""
        )
        return (
            f"{flag} {count} is above the {env.gpus} visible GPU(s); use {flag} {env.gpus} or "
            f"fewer{one_per_gpu}"
        )
    if cfg.sync_bn and cfg.mode == "ddp" and not use_cuda:
        return "--sync-bn needs CUDA devices (SyncBatchNorm is GPU-only); drop --sync-bn on CPU"
    return None


def check_threads(threads: int, env: Environment, flag: str = "--threads") -> None:
    """ValueError when `threads` per process is above the cores this process may run on (torch
    creates that many OpenMP threads; 100000 of them crash the process)."""
    if threads > env.cpu_cores:
        raise ValueError(
            f"{flag} {threads} is above the {env.cpu_cores} CPU core(s) this process may use; "
            f"pass at most {env.cpu_cores} (0 = cores ÷ processes per node)"
        )


def check_machine(cfg: TrainConfig, env: Environment) -> None:
    """--threads and --num-workers bounded by this machine's cores (ValueError naming the flag);
    torch's DataLoader itself suggests at most one worker per core."""
    check_threads(cfg.threads, env)
    if cfg.num_workers > env.cpu_cores:
        raise ValueError(
            f"--num-workers {cfg.num_workers} is above the {env.cpu_cores} CPU core(s) this "
            f"process may use; pass at most {env.cpu_cores} DataLoader workers per rank"
        )


def plan(cfg: TrainConfig, env: Environment, *, nproc: int | None = None, nnodes: int = 1) -> Plan:
    """Lay out `cfg` on `env`: `nproc` processes per node for DDP and FSDP (default: one per GPU,
    2 on CPU), DP's GPUs (`nproc`, else `cfg.dp_gpus`, else every visible GPU), one device otherwise.

    Raises ValueError for a request that is wrong in every mode (fewer than one process, more
    threads or DataLoader workers per rank than the machine has cores: `check_machine`); what
    this machine or this batch cannot do in this mode is returned as `reason`.
    """
    if nproc is not None and nproc < 1:
        raise ValueError(f"--nproc must be >= 1; got {nproc}")
    check_machine(cfg, env)
    use_cuda = cfg.device != "cpu" and env.cuda
    gpus = env.gpus if use_cuda else 0
    flag = "--nproc" if nproc else "--dp-gpus"
    if cfg.mode in PROCESS_GROUP_MODES:
        backend = resolve_backend(cfg.backend, use_cuda=use_cuda, system=env.system)
        count, nodes = nproc or (gpus if use_cuda else 2), nnodes
    else:
        backend, nodes = "none", 1
        count = 1 if cfg.mode == "single" else (nproc or cfg.dp_gpus or gpus or None)
    reason = _check(cfg, env, backend, count or 0, flag)
    global_batch = per_device = threads = devices = None
    if reason is None:
        try:  # a global batch that does not divide over the replicas cannot run here either
            global_batch, per_device = batch_split(cfg, count * nodes)
        except ValueError as exc:
            reason = str(exc)
    processes = count if cfg.mode in PROCESS_GROUP_MODES else 1
    warnings: tuple[str, ...] = ()
    if reason is None:  # a refused plan leaves the layout null (what a skipped record holds)
        devices = [f"cuda:{i}" if use_cuda else "cpu" for i in range(count)] * nodes
        auto = env.torch_threads if use_cuda else max(1, env.cpu_cores // processes)
        threads = cfg.threads or auto  # --threads N wins
        if not use_cuda and processes > env.cpu_cores:
            warnings = (
                f"--nproc {processes} exceeds the {env.cpu_cores} CPU cores; ranks will "
                "time-share cores (1 thread each) and step times will not be representative",
            )
    return Plan(
        mode=cfg.mode,
        backend=backend,
        nnodes=nodes,
        nproc=processes,
        replicas=None if count is None else count * nodes,
        devices=devices,
        global_batch=global_batch,
        per_device_batch=per_device,
        threads_per_rank=threads,
        reason=reason,
        warnings=warnings,
    )


def runnable_plan(
    cfg: TrainConfig,
    env: Environment,
    *,
    prog: str,
    error: type[Exception] = ValueError,
    nproc: int | None = None,
) -> Plan:
    """`plan` for a tool that runs exactly one job (bench-comm, tune-ddp): a plan that cannot run
    here raises `error(plan.reason)`; its warnings go to stderr as `<prog>: warning: ...`."""
    p = plan(cfg, env, nproc=nproc)
    if p.reason is not None:
        raise error(p.reason)
    for warning in p.warnings:
        print(f"{prog}: warning: {warning}", file=sys.stderr)
    return p
