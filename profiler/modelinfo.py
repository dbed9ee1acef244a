"""What run.json says about the model trained, read from the module after training: its class and
parameter count, DDP's bucket layout, FSDP2's parameter groups, and gradient and buffer bytes
(docs/reference/run-folder.md).

Shared by every run-record writer (workloads.train.finish, profiler.recorder), so a script run
and a built-in run describe their model with the same numbers.
"""

from __future__ import annotations

import re

from torch import nn

from profiler.memory_sharded import fsdp_info

__all__ = ["class_name", "ddp_info", "model_metrics", "model_summary", "unwrap"]


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside DataParallel / DDP wrappers."""
    while isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
        model = model.module
    return model


def class_name(module: nn.Module) -> str:
    """The module's class name; a fully_shard-ed module's own class (FSDP2 makes `FSDP<Class>`, a
    subclass of FSDPModule and of the class)."""
    cls = type(module)
    if cls.__name__.startswith("FSDP") and len(cls.__bases__) == 2:
        return cls.__bases__[1].__name__
    return cls.__name__


def buffer_bytes_by_dtype(module: nn.Module) -> dict[str, int]:
    out: dict[str, int] = {}
    for b in module.buffers():
        key = str(b.dtype).removeprefix("torch.")
        out[key] = out.get(key, 0) + b.numel() * b.element_size()
    return out


def ddp_info(model: nn.Module) -> dict | None:
    """Bucket layout and gradient volume of a DDP model (None for other modes)."""
    if not isinstance(model, nn.parallel.DistributedDataParallel):
        return None
    params = [p for p in model.module.parameters() if p.requires_grad]
    # Bucket sizes as the DDP reducer reports them: after the first steps the reducer rebuilds its
    # buckets in gradient-ready order (`rebuilt_bucket_sizes`); before that, or with static
    # bucketing, its initial reverse-parameter-order assignment (`bucket_sizes`).
    info = model._get_ddp_logging_data()
    sizes = info.get("rebuilt_bucket_sizes") or info.get("bucket_sizes") or ""
    bucket_sizes = [int(s) for s in re.findall(r"\d+", str(sizes))]
    return {
        "num_buckets": len(bucket_sizes),
        "bucket_sizes_bytes": bucket_sizes,
        "grad_bytes_total": sum(p.numel() * p.element_size() for p in params),
        "param_count": sum(p.numel() for p in params),
    }


def model_metrics(model: nn.Module, *, inner: nn.Module | None = None) -> dict:
    """run.json metrics read from the model after training: DDP's buckets, gradient and buffer
    bytes (of `inner`, the trained module without its wrappers; default `unwrap(model)`)."""
    inner = unwrap(model) if inner is None else inner
    return {
        "ddp": ddp_info(model),
        "fsdp": fsdp_info(inner),
        # Per-parameter gradient bytes in model.parameters() order: what DDP's reducer buckets
        # (analysis project computes a single-device run's buckets from it).
        "param_grad_bytes": [
            p.numel() * p.element_size() for p in inner.parameters() if p.requires_grad
        ],
        # What DDP's buffer broadcast moves at every forward: one coalesced call per dtype.
        "buffer_bytes_by_dtype": buffer_bytes_by_dtype(inner),
    }


def model_summary(model: nn.Module) -> dict:
    """run.json `config.model` (the unwrapped module's class name) and `config.param_count`."""
    inner = unwrap(model)
    return {
        "model": class_name(inner),
        "param_count": sum(p.numel() for p in inner.parameters()),
    }
