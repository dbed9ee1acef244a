"""The run.json record of a training run (docs/reference/run-folder.md): what the launcher writes before
the training starts (`running`, or `skipped` with the reason) and rank 0 writes at its end (`ok`).

Kept apart from the configuration (workloads.config) and the plan (workloads.plan), which it
joins: both are inputs of the record, neither needs it. The file itself is written through the
run-folder contract (profiler.runfolder.layout.write_run_json), like every other run.json writer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from profiler.environment import collect_env
from profiler.runfolder.layout import utc_now
from profiler.runfolder.versions import RUN_JSON_SCHEMA_VERSION
from profiler.session import ProfileConfig
from workloads.config import TrainConfig
from workloads.plan import Plan
from workloads.train.context import first_bucket_bytes

if TYPE_CHECKING:  # the type only: the launcher and rank 0 pass what they measured
    from workloads.train.workload import WorkloadFacts

__all__ = ["config_record", "fsdp_record", "run_record"]


def fsdp_record(cfg: TrainConfig) -> dict | None:
    """run.json `config.fsdp` (null outside --mode fsdp): the wrap rule (`default`, or the
    --fsdp-wrap classes as given) and reshard_after_forward."""
    if cfg.mode != "fsdp":
        return None
    return {"wrap": cfg.fsdp_wrap or "default", "reshard_after_forward": cfg.reshard_after_forward}


def run_record(
    cfg: TrainConfig,
    plan: Plan,
    *,
    status: str,
    threads_per_rank: int | None,
    error: dict | None = None,
    created_at: str | None = None,
    metrics: dict | None = None,
    evals: dict | None = None,
    traces: list[str] | None = None,
    workload: WorkloadFacts | None = None,
) -> dict:
    """The whole run.json object (docs/reference/run-folder.md), as the launcher and rank 0 write it."""
    now = utc_now()
    return {
        "schema_version": RUN_JSON_SCHEMA_VERSION,
        "run_id": cfg.run_id,
        "status": status,
        "error": error,
        "created_at": created_at or now,
        "finished_at": None if status == "running" else now,
        "config": config_record(cfg, plan, workload=workload),
        "env": collect_env(
            threads_per_rank=threads_per_rank,
            device_type=None if plan.devices is None else ("cuda" if plan.use_cuda else "cpu"),
        ),
        "metrics": metrics or {},
        "eval": evals or {"epochs": [], "best": None},
        "traces": traces or [],
    }


def config_record(cfg: TrainConfig, plan: Plan, *, workload: WorkloadFacts | None = None) -> dict:
    """The run.json `config` object (docs/reference/run-folder.md); layout fields come from the plan (null
    where a skipped run's plan could not decide them), `workload` from the built model and data
    (null when not given)."""
    micro = None if plan.per_device_batch is None else plan.per_device_batch // cfg.grad_accum_steps
    return {
        "mode": cfg.mode,
        "backend": plan.backend,
        "world_size": plan.replicas,
        "nnodes": plan.nnodes,
        "nproc_per_node": plan.nproc,
        "devices": plan.devices,
        "model": cfg.model,
        "model_args": cfg.model_kwargs(),
        "dataset": cfg.dataset,
        "dataset_args": cfg.dataset_kwargs(),
        "loss": cfg.loss,
        "model_facts": None if workload is None else workload.record(micro),
        "global_batch": plan.global_batch,
        "per_device_batch": plan.per_device_batch,
        "grad_accum_steps": cfg.grad_accum_steps,
        "micro_batch": micro,
        "scaling": cfg.scaling,
        "amp": cfg.amp,
        "seed": cfg.seed,
        "epochs": cfg.epochs,
        "max_steps": cfg.max_steps,
        "lr": cfg.lr,
        "momentum": cfg.momentum,
        "weight_decay": cfg.weight_decay,
        "sync_bn": cfg.sync_bn,
        "num_workers": cfg.num_workers,
        "pin_memory": cfg.pin_memory,
        "warmup_steps": cfg.warmup_steps,
        "eval_batches": cfg.eval_batches,
        "rendezvous": cfg.rendezvous,
        "ddp": {
            "bucket_cap_mb": cfg.bucket_cap_mb,
            "first_bucket_bytes": first_bucket_bytes(cfg.bucket_cap_mb),
            "gradient_as_bucket_view": cfg.gradient_as_bucket_view,
            "static_graph": cfg.static_graph,
            "find_unused_parameters": cfg.find_unused_parameters,
            "comm_hook": cfg.comm_hook,
        },
        "zero": cfg.zero,
        "fsdp": fsdp_record(cfg),
        "profile": ProfileConfig(**cfg.profile_kwargs()).to_dict(),
        "sweep_id": cfg.sweep_id or None,
        # `--repeat` rounds (workloads.launch.rounds): the set and this run's round in it
        "repeat_id": cfg.repeat_id or None,
        "repeat_round": cfg.repeat_round if cfg.repeat_id else None,
    }
