"""The data-parallel family side by side: what ZeRO-1 and FSDP2 save per rank against DDP on the
same workload, at what throughput, and the largest model each fits in a per-rank memory budget
(the runs JSON's `family`; definitions: docs/reference/metrics.md §11a).

- **Strategy** of a run: `single`, `dp`, `ddp`, `zero1` (DDP with ZeroRedundancyOptimizer),
  `fsdp` (FSDP2, resharding after forward) or `fsdp_keep` (FSDP2 keeping the gathered parameters
  from forward to backward), from config.mode, config.zero and config.fsdp.
- **Model state per rank** (`model_state_bytes`): the memory breakdown's static total
  (parameters, gradients, optimizer state, buffers, DDP buckets: each storage once, from the
  real shards) plus FSDP's unsharded peak (gathered parameters at the busiest moment), of the
  fullest rank; a strategy's value is the mean over its runs (seeds).
- **Saved** by a member: DDP's model state per rank less the member's, in bytes and as a
  percentage of DDP's; its **throughput** as a percentage of DDP's mean samples/s. Only runs of
  the same workload, backend and world size are compared.
- **Capacity**: model state is `fixed + bytes_per_param × P` for a model of P parameters scaled
  with the same proportions: every category but the buffers grows with P (parameters, gradients
  and optimizer state, DDP's buckets, ZeRO-1's share of the state, FSDP's shards and gathered
  blocks), so `bytes_per_param` = (model state − buffers) ÷ P of the measured run, exactly at the
  measured size, and `fixed` = its buffers. The largest P that fits a per-rank budget B is
  ⌊(B − fixed) ÷ bytes_per_param⌋. B is `--memory-budget-gib`, else the device's memory
  (env.device_memory_bytes: the GPU's; on CPU the host's RAM ÷ the ranks per node). Activations
  and temporaries come on top: they grow with the batch, not with P.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from profiler.runfolder.errors import InputError
from profiler.runfolder.schema import Config, Env, Metrics

__all__ = [
    "LABELS",
    "SHARDED",
    "budget_bytes",
    "family_fields",
    "family_summary",
    "model_state_bytes",
    "strategy",
]

LABELS = {
    "single": "Single",
    "dp": "DP",
    "ddp": "DDP",
    "zero1": "ZeRO-1",
    "fsdp": "FSDP2",
    "fsdp_keep": "FSDP2 (no reshard)",
}
SHARDED = ("zero1", "fsdp", "fsdp_keep")
CATEGORIES = (
    "parameters_bytes",
    "gradients_bytes",
    "optimizer_state_bytes",
    "ddp_buckets_bytes",
    "fsdp_unsharded_peak_bytes",
)
GIB = 2**30


def budget_bytes(gib: float | None) -> int | None:
    """`--memory-budget-gib` in bytes (None: the device's memory); one line unless > 0."""
    if gib is None:
        return None
    if not (isinstance(gib, int | float) and math.isfinite(gib) and gib > 0):
        raise InputError("--memory-budget-gib", f"got {gib}", "give the per-rank memory in GiB, > 0")
    return int(gib * GIB)


def strategy(mode: str | None, zero: int | None, reshard_after_forward: bool | None) -> str | None:
    """The family member a run is (module docstring); None for an unknown mode."""
    if mode == "ddp" and zero:
        return "zero1"
    if mode == "fsdp":
        return "fsdp_keep" if reshard_after_forward is False else "fsdp"
    return mode if mode in LABELS else None


def family_fields(config: Config, metrics: Metrics, env: Env) -> dict[str, Any]:
    """The run entry's family fields from its run.json: zero (0 for a record without it), fsdp,
    strategy, fsdp_groups, device_memory_bytes and nproc_per_node (the budget's default)."""
    fsdp = config.fsdp
    reshard = fsdp.reshard_after_forward if fsdp else None
    return {
        "zero": config.zero or 0,
        "fsdp": {"wrap": fsdp.wrap, "reshard_after_forward": reshard} if fsdp else None,
        "strategy": strategy(config.mode, config.zero, reshard),
        "fsdp_groups": [
            {f: getattr(g, f) for f in g.__struct_fields__} for g in metrics.fsdp.groups
        ]
        if metrics.fsdp
        else [],
        "device_memory_bytes": env.device_memory_bytes,
        "nproc_per_node": config.nproc_per_node,
    }


def _state(entry: dict) -> int | None:
    total = entry.get("static_total_bytes")
    return None if total is None else int(total + (entry.get("fsdp_unsharded_peak_bytes") or 0))


def model_state_bytes(run: dict) -> int | None:
    """Model state of the run's fullest rank (module docstring); None without a breakdown."""
    values = [_state(e) for e in run.get("memory_breakdown") or []]
    return max(values) if values and None not in values else None


def _fullest(run: dict) -> dict | None:
    entries = [e for e in run.get("memory_breakdown") or [] if _state(e) is not None]
    return max(entries, key=_state, default=None)


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def _member(name: str, runs: list[dict]) -> dict[str, Any]:
    """One strategy's runs of a comparison: ids, model state, throughput, bytes per parameter."""
    per_param, fixed, by_cat = [], [], {k: [] for k in CATEGORIES}
    for run in runs:
        top, params = _fullest(run), run.get("parameters")
        if top is None or not params:
            continue
        fixed.append(top.get("buffers_bytes") or 0)
        per_param.append((_state(top) - fixed[-1]) / params)
        for k in CATEGORIES:
            by_cat[k].append((top.get(k) or 0) / params)
    return {
        "strategy": name,
        "label": LABELS[name],
        "run_ids": [r["run_id"] for r in runs],
        "model_state_bytes": _mean([model_state_bytes(r) for r in runs]),
        "samples_per_s_mean": _mean([r.get("samples_per_s") for r in runs]),
        "bytes_per_param": _mean(per_param),
        "bytes_per_param_by_category": {k: _mean(v) for k, v in by_cat.items()},
        "fixed_bytes": _mean(fixed),
    }


def _budget(ref: dict, budget_bytes: int | None) -> tuple[int | None, str]:
    """The per-rank budget and where it came from (module docstring)."""
    if budget_bytes is not None:
        return budget_bytes, f"--memory-budget-gib {budget_bytes / GIB:g}"
    total = ref.get("device_memory_bytes")
    if not total:
        return None, "unknown (the runs do not record the device's memory: pass --memory-budget-gib)"
    if ref.get("device_type") == "cuda":
        return int(total), "the GPU's memory"
    ranks = ref.get("nproc_per_node") or ref.get("world_size") or 1
    return int(total // ranks), f"the host's RAM ÷ {ranks} ranks per node"


def _capacity(member: dict, budget: int | None) -> dict[str, Any]:
    per_param, fixed = member["bytes_per_param"], member["fixed_bytes"] or 0
    fits = None
    if budget is not None and per_param:
        fits = max(0, math.floor((budget - fixed) / per_param))
    return {"strategy": member["strategy"], "label": member["label"],
            "bytes_per_param": per_param, "fixed_bytes": fixed, "max_params": fits}  # fmt: skip


def _comparison(rows: list[dict], singles: list[dict], budget_bytes: int | None) -> dict | None:
    """The family entry of one workload, backend and world size (None without DDP and a
    sharded member)."""
    by_strategy: dict[str, list[dict]] = {}
    for r in rows:
        by_strategy.setdefault(r["strategy"], []).append(r)
    if "ddp" not in by_strategy or not any(s in by_strategy for s in SHARDED):
        return None
    ref = _member("ddp", by_strategy["ddp"])
    members = [_member(s, by_strategy[s]) for s in SHARDED if s in by_strategy]
    for m in members:
        saved = (ref["model_state_bytes"] or 0) - (m["model_state_bytes"] or 0)
        both = ref["model_state_bytes"] and m["model_state_bytes"] is not None
        m["saved_bytes"] = saved if both else None
        m["saved_pct"] = 100 * saved / ref["model_state_bytes"] if both else None
        sps, ref_sps = m["samples_per_s_mean"], ref["samples_per_s_mean"]
        m["throughput_vs_ddp_pct"] = 100 * sps / ref_sps if sps and ref_sps else None
    budget, source = _budget(by_strategy["ddp"][0], budget_bytes)
    measured = ([_member("single", singles)] if singles else []) + [ref, *members]
    first = by_strategy["ddp"][0]
    return {
        "model": first.get("model"),
        "dataset": first.get("dataset"),
        "backend": first.get("backend"),
        "world_size": first.get("world_size"),
        "parameters": first.get("parameters"),
        "ddp": ref,
        "members": members,
        "budget_bytes": budget,
        "budget_source": source,
        "capacity": [_capacity(m, budget) for m in measured if m["bytes_per_param"]],
    }


def family_summary(
    rows: list[dict], fields: tuple[str, ...], budget_bytes: int | None = None
) -> list[dict]:
    """The runs JSON `family`: one entry per workload (its `fields`, the same-workload key),
    backend and world size with a DDP run and a ZeRO-1 or FSDP2 run (module docstring), each with
    its capacity at the per-rank budget (`budget_bytes`, default the device's memory)."""

    def key(r: dict) -> tuple:
        return tuple(r.get(k) for k in fields)

    ok = [r for r in rows if r.get("status") == "ok" and r.get("strategy")]
    buckets: dict[tuple, list[dict]] = {}
    for r in ok:
        if r["strategy"] in ("ddp", *SHARDED):
            buckets.setdefault((key(r), r.get("backend"), r.get("world_size")), []).append(r)
    out = []
    for (workload, _, _), members in buckets.items():
        singles = [r for r in ok if r["strategy"] == "single" and key(r) == workload]
        entry = _comparison(members, singles, budget_bytes)
        if entry is not None:
            out.append({**dict(zip(fields, workload, strict=True)), **entry})
    return out
