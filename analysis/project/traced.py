"""What a DDP run's own traces say about its communication (definitions: docs/reference/metrics.md
§10, "Projection"): the exposed share of its step, and per gradient bucket the all-reduce time and
the idle gap before it, as the run itself paid them.

Both are read from the rank summaries of the trace analysis (analysis.trace), per analysed step:

- **exposed share** (`exposed_share`): a synchronous step is set by the rank that arrives last at
  each collective; the other ranks' extra exposed time is their wait for it (rank skew, the
  straggler term's part), not communication. So per analysed step the share is the smallest
  exposed communication over the ranks ÷ the mean traced step, averaged over the steps the ranks
  share (by step number); ranks without matching steps: the smallest rank-mean share.
- **per-bucket calls** (`bucket_calls`): in each step's `backward` range (the loop's profiler
  range) the all-reduce calls are DDP's buckets in order; steps with another count are left out.
  For bucket k of step i the time is the smallest latency over the ranks (the last rank to issue
  it: the others waited for it), its gap the time from the end of the collective before it on
  that rank; the buffer broadcasts are the broadcast calls in the step's `forward` range. Means
  over the steps, in traced µs (the caller scales them to unprofiled steps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from analysis.trace.folder import find_trace_files, reduce_files, traces_row

__all__ = ["bucket_calls", "exposed_share", "read_rank_rows"]


def read_rank_rows(trace_dir: Path) -> list[dict[str, Any]]:
    """Every readable trace of `trace_dir` as its traces-JSON rank row plus the collective
    `instances` (µs from that rank's own origin, the clock of its `memory.phases`).
    AnalysisError (one line) when no trace could be analysed."""
    good, skipped = reduce_files(find_trace_files(trace_dir), progress=False)
    if not good:
        from analysis.errors import AnalysisError

        reasons = "; ".join(f"{Path(s['file']).name}: {s['reason']}" for s in skipped[:3])
        raise AnalysisError(trace_dir, f"no usable trace ({reasons})", "fix or re-profile them")
    return [{**traces_row(s), "instances": s.instances} for s in good]


def exposed_share(ranks: list[dict]) -> float | None:
    """The exposed communication share of the step of the rank that arrives last (the module
    docstring); None when no rank has a step time and an exposed time."""
    rows = [r for r in ranks if r.get("exposed_comm_us") is not None and r.get("step_time_us_mean")]
    if not rows:
        return None
    by_step: dict[Any, list[tuple[float, float]]] = {}
    for r in rows:
        for s in r.get("per_step") or []:
            if s.get("step") is not None and s.get("step_time_us"):
                by_step.setdefault(s["step"], []).append((s["exposed_comm_us"], s["step_time_us"]))
    shared = [v for v in by_step.values() if len(v) == len(rows)]
    if shared:
        exposed = np.mean([min(e for e, _ in v) for v in shared])
        return float(exposed / np.mean([t for v in shared for _, t in v]))
    return float(min(r["exposed_comm_us"] / r["step_time_us_mean"] for r in rows))


def _calls(instances: dict[str, dict], suffix: str) -> list[tuple[float, float]]:
    """(start, end) µs of the calls whose name ends with `suffix`, by start."""
    out = []
    for name, inst in instances.items():
        if name.endswith(suffix):
            out += zip(np.asarray(inst["start_us"]).tolist(),
                       (np.asarray(inst["start_us"]) + np.asarray(inst["latency_us"])).tolist(),
                       strict=True)  # fmt: skip
    return sorted(out)


def _rank_steps(rank: dict, n_buckets: int) -> list[dict]:
    """Per step of one rank whose backward holds `n_buckets` all-reduce calls: their latencies,
    the gaps before them, and the latencies of the broadcasts in its forward."""
    phases = (rank.get("memory") or {}).get("phases") or []
    fwd = [(p["start_us"], p["end_us"]) for p in phases if p["phase"] == "forward"]
    bwd = [(p["start_us"], p["end_us"]) for p in phases if p["phase"] == "backward"]
    inst = rank.get("instances") or {}
    every = sorted(_calls(inst, ""))
    reduce, bcast = _calls(inst, "all_reduce"), _calls(inst, "broadcast")
    out = []
    for b0, b1 in bwd:
        mine = [c for c in reduce if b0 <= c[0] <= b1]
        if len(mine) != n_buckets or not mine:
            continue
        before = [e for s, e in every if e <= mine[0][0]]
        ends = [before[-1] if before else None] + [e for _, e in mine[:-1]]
        f0, f1 = max((f for f in fwd if f[0] <= b0), default=(b0, b0))
        out.append({
            "latency_us": [e - s for s, e in mine],
            "gap_us": [None if p is None else s - p for (s, _), p in zip(mine, ends, strict=True)],
            "broadcast_us": [e - s for s, e in bcast if f0 <= s <= f1],
        })  # fmt: skip
    return out


def bucket_calls(ranks: list[dict], n_buckets: int) -> dict | None:
    """{steps, bucket_us, bucket_gaps_us, broadcast_us, step_time_us} of the module docstring,
    traced µs; None when no step of every rank has `n_buckets` all-reduce calls in its backward."""
    per_rank = [_rank_steps(r, n_buckets) for r in ranks]
    steps = min((len(p) for p in per_rank), default=0)
    if steps == 0:
        return None
    lat = np.array([[p[i]["latency_us"] for i in range(steps)] for p in per_rank])  # r, i, k
    last = lat.argmin(axis=0)  # per step and bucket: the rank that issued it last
    gaps = [[per_rank[last[i, k]][i]["gap_us"][k] for k in range(n_buckets)] for i in range(steps)]
    gap_mean = [_mean([g[k] for g in gaps]) for k in range(n_buckets)]
    bc = [min((p[i]["broadcast_us"] for p in per_rank), key=sum) for i in range(steps)]
    width = min(len(b) for b in bc)
    return {
        "steps": steps,
        "bucket_us": lat.min(axis=0).mean(axis=0).tolist(),
        "bucket_gaps_us": gap_mean,
        "broadcast_us": np.mean([b[:width] for b in bc], axis=0).tolist() if width else [],
        "step_time_us": float(np.mean([r["step_time_us_mean"] for r in ranks])),
    }


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None
