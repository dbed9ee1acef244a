"""Where the memory goes, across runs (docs/reference/metrics.md §11): the static floor of a
breakdown entry, the per-rank static difference between a run and its single-device run and the
category that makes it, what DP's first GPU holds that the others do not, and the allocated-bytes
timelines the report draws. Everything the report's memory part shows is decided here.
"""

from __future__ import annotations

from typing import Any

import msgspec

from analysis.runs.entry import RunEntry
from analysis.runs.groups import workload_key
from analysis.runs.notes import Advice, advice_of
from analysis.runs.runsjson import RunsJson
from profiler.runfolder.schema import PROCESS_GROUP_MODES

__all__ = [
    "STATIC_KEYS",
    "DpFirstGpu",
    "StaticDelta",
    "TimelinePanel",
    "breakdown_rows",
    "floor_bytes",
    "memory_cases",
    "static_difference",
    "timeline_panels",
]

# The static categories of a breakdown entry (bytes), in the order the report stacks them.
STATIC_KEYS = (
    "parameters_bytes",
    "gradients_bytes",
    "optimizer_state_bytes",
    "buffers_bytes",
    "ddp_buckets_bytes",
)
SAME_STATIC_FRAC = 0.01  # a static difference under this share of the single run's is "the same"


def floor_bytes(entry: dict[str, Any], mode: str | None) -> int | None:
    """Bytes that stay allocated between steps: the static total less the gradients, which
    `zero_grad(set_to_none=True)` frees every step, except under DDP with no unshared buckets
    (gradient-as-bucket-view), where the gradients are the bucket storage and stay."""
    total, grads = entry.get("static_total_bytes"), entry.get("gradients_bytes")
    if total is None or grads is None:
        return None
    if mode == "ddp" and entry.get("ddp_buckets_bytes") == 0:
        return int(total)
    return int(total - grads)


def breakdown_rows(runs: list[RunEntry]) -> list[dict[str, Any]]:
    """The breakdown table's rows: each entry of each run's `memory_breakdown` with its run and mode."""
    return [{"run_id": run.run_id, "mode": run.mode, **e} for run in runs for e in run.memory_breakdown]


def _mean(entries: list[dict[str, Any]], key: str) -> float | None:
    vals = [e[key] for e in entries if e.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


class StaticDelta(msgspec.Struct, kw_only=True):
    """Per-rank static memory of a run less its single-device run's (bytes, means over ranks):
    `diff_bytes` = `total` − `ref`; `cause` the category (STATIC_KEYS) that differs most, by
    `cause_bytes`; `same` when the difference is under SAME_STATIC_FRAC of `ref`; `grads_ratio` =
    |diff| ÷ the single run's gradients; `bucket_view` a DDP run whose buckets hold 0 bytes;
    `sharded` an FSDP2 run (every category shrinks at once), `gathered_bytes` its mean unsharded
    peak (the gathered blocks)."""

    run: RunEntry
    single: RunEntry
    advice: Advice
    total: float
    ref: float
    grads: float
    diff_bytes: float
    cause: str
    cause_bytes: float
    same: bool
    grads_ratio: float
    bucket_view: bool
    sharded: bool = False
    gathered_bytes: float | None = None


def static_difference(run: RunEntry, single: RunEntry) -> StaticDelta | None:
    """The StaticDelta of `run` against `single`; None without both breakdowns."""
    mine, base = run.memory_breakdown, single.memory_breakdown
    total, ref = _mean(mine, "static_total_bytes"), _mean(base, "static_total_bytes")
    grads = _mean(base, "gradients_bytes")
    if total is None or ref is None or not grads:
        return None
    deltas = {k: (_mean(mine, k) or 0) - (_mean(base, k) or 0) for k in STATIC_KEYS}
    cause = max(deltas, key=lambda k: abs(deltas[k]))
    diff = total - ref
    return StaticDelta(
        run=run, single=single, advice=advice_of(run.advice), total=total, ref=ref, grads=grads,
        diff_bytes=diff, cause=cause, cause_bytes=deltas[cause],
        same=abs(diff) < SAME_STATIC_FRAC * ref, grads_ratio=abs(diff) / grads,
        bucket_view=run.mode == "ddp" and _mean(mine, "ddp_buckets_bytes") == 0,
        sharded=run.mode == "fsdp", gathered_bytes=_mean(mine, "fsdp_unsharded_peak_bytes"),
    )  # fmt: skip


class DpFirstGpu(msgspec.Struct, kw_only=True):
    """What DP's first GPU holds beyond any other (bytes): `extra_bytes` of static memory, its
    static categories (`parts`: STATIC_KEYS key -> bytes, the non-zero ones) and the forward peak
    there and on the others (mean)."""

    run: RunEntry
    device: str
    extra_bytes: float
    parts: dict[str, float]
    forward_peak_bytes: float | None = None
    others_forward_peak_bytes: float | None = None


def _dp_first_gpu(run: RunEntry) -> DpFirstGpu | None:
    entries = sorted(run.memory_breakdown, key=lambda e: e["device"])
    if len(entries) < 2 or entries[0].get("static_total_bytes") is None:
        return None
    first, rest = entries[0], entries[1:]
    others = max((e.get("static_total_bytes") or 0) for e in rest)
    f0, f1 = first.get("forward_peak_bytes"), _mean(rest, "forward_peak_bytes")
    return DpFirstGpu(
        run=run, device=first["device"], extra_bytes=first["static_total_bytes"] - others,
        parts={k: first[k] for k in STATIC_KEYS if first.get(k)},
        forward_peak_bytes=f0 if f1 is not None else None,
        others_forward_peak_bytes=f1 if f0 is not None else None,
    )  # fmt: skip


def memory_cases(runs: list[RunEntry]) -> list[StaticDelta | DpFirstGpu]:
    """For the measured `runs` with a breakdown, in order: each DP run's first-GPU extra and each
    DDP, ZeRO-1 or FSDP2 run's static difference from a single run of the same workload (WORKLOAD_KEY; the same
    seed preferred)."""
    runs = [r for r in runs if r.memory_breakdown]
    singles = [r for r in runs if r.mode == "single"]
    out: list[StaticDelta | DpFirstGpu] = []
    for run in runs:
        if run.mode == "dp" and (gpu := _dp_first_gpu(run)):
            out.append(gpu)
        if run.mode not in PROCESS_GROUP_MODES:  # DP's devices differ by design: the first-GPU
            # case says why
            continue
        same = [s for s in singles if workload_key(s) == workload_key(run)]
        base = next((s for s in same if s.seed == run.seed), same[0] if same else None)
        if base is not None and (d := static_difference(run, base)):
            out.append(d)
    return out


class PhaseSpan(msgspec.Struct, kw_only=True):
    phase: str = ""
    start_us: float = 0.0
    end_us: float = 0.0


class TimelinePanel(msgspec.Struct, kw_only=True):
    """One rank and device's allocated bytes over the profiled steps (µs on the rank's clock),
    its phase spans and static floor. `on_floor`: a CPU curve, which only counts allocations made
    while profiling, is drawn with its `start_level_bytes` (the value where its first traced
    forward begins) on the floor; a CUDA curve is the caching allocator's total as it is.
    `t0_us` is the first traced phase (or sample)."""

    run_id: str
    rank: int
    device: str
    t_us: list[float]
    allocated_bytes: list[float]
    phases: list[PhaseSpan]
    floor_bytes: int | None
    start_level_bytes: float | None
    on_floor: bool
    t0_us: float


def _panel(run: RunEntry, rank: dict, dev: dict, entry: dict) -> TimelinePanel:
    mem = rank.get("memory") or {}
    phases = msgspec.convert(mem.get("phases", []), list[PhaseSpan])
    floor = floor_bytes(entry, run.mode)
    start = dev.get("start_level_bytes")
    return TimelinePanel(
        run_id=run.run_id, rank=rank["rank"], device=dev["device"], t_us=dev["timeline"]["t_us"],
        allocated_bytes=dev["timeline"]["allocated_bytes"], phases=phases, floor_bytes=floor,
        start_level_bytes=start,
        on_floor=dev["device"] == "cpu" and floor is not None and start is not None,
        t0_us=min([ph.start_us for ph in phases] or dev["timeline"]["t_us"][:1]),
    )  # fmt: skip


def timeline_panels(doc: RunsJson) -> list[TimelinePanel]:
    """One panel per traced rank and device that has a breakdown entry, of the first measured run
    of each configuration (workload, mode, backend, world size): other seeds of one
    configuration allocate the same way."""
    out, drawn = [], set()
    for run in doc.measured():
        config = (workload_key(run), run.mode, run.backend, run.world_size)
        if config in drawn:
            continue
        drawn.add(config)
        entries = {(e["rank"], e["device"]): e for e in run.memory_breakdown}
        for rank in (run.trace or {}).get("ranks") or []:
            for dev in (rank.get("memory") or {}).get("devices", []):
                entry = entries.get((rank["rank"], dev["device"]))
                if entry is not None and dev["timeline"]["t_us"]:
                    out.append(_panel(run, rank, dev, entry))
    return out
