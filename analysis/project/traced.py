"""What a DDP run's own traces say about its communication (definitions: docs/reference/metrics.md
§10, "Projection"): the exposed share of its step, and per gradient bucket the all-reduce time and
the idle gap before it, as the run itself paid them.

Both are read from the rank summaries of the trace analysis (analysis.trace), per analysed step:

- **exposed share**: a synchronous step is set by the rank that arrives last at each collective;
  the other ranks' extra exposed time is their wait for it (rank skew, the straggler term's
  part), not communication. With the per-bucket calls below, the step's exposed communication is
  that of the rank that issued its last bucket last (`bucket_calls` `exposed_share`, its mean ÷
  its mean step); without them (a traces JSON) `exposed_share`: per analysed step the smallest
  exposed communication over the ranks ÷ the mean traced step, averaged over the steps the ranks
  share (by step number); ranks without matching steps: the smallest rank-mean share.
- **per-bucket calls** (`bucket_calls`): in each step's `backward` range (the loop's profiler
  range) the all-reduce calls are DDP's buckets in order; steps with another count are left out.
  The step's frame is the rank that issued its last bucket last (the one the step waited for):
  there the backward compute before the communication ends at backward's length − its exposed
  communication in backward (the step's exposed time − its forward broadcasts) − the finalize
  after the last call (DDP's copy back into the gradients), and each call's lead is how long
  before that end it started (so the self-replay places it where the run did, skew-free).
  For bucket k of step i the time is the smallest latency over the ranks (the last rank to issue
  it: the others waited for it), each cut at the end of that rank's backward (which waits for
  every bucket: a span past it is the transport's bookkeeping after the wait returned), its start the time from the start of backward on that rank, its
  gap the time from the end of the collective before it there; the buffer broadcasts are the broadcast calls in the step's `forward` range on the
  step's frame rank (below). Means over the steps, in traced µs (the caller scales them to
  unprofiled steps).
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
    InputError (one line) when no trace could be analysed."""
    good, skipped = reduce_files(find_trace_files(trace_dir), progress=False)
    if not good:
        from profiler.runfolder.errors import InputError

        reasons = "; ".join(f"{Path(s['file']).name}: {s['reason']}" for s in skipped[:3])
        raise InputError(trace_dir, f"no usable trace ({reasons})", "fix or re-profile them")
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
    """Per analysed step of one rank whose backward holds `n_buckets` all-reduce calls (the
    backward ranges holding any, in order, are its `per_step` rows): each call's latency (cut at
    backward's end), start and gap, the broadcasts in its forward, the `finalize_us` after the last
    call (backward's end − that call's end: DDP's copy back into the gradients) and each call's
    `lead_us` before the end of the backward compute that precedes the communication."""
    phases = (rank.get("memory") or {}).get("phases") or []
    fwd = [(p["start_us"], p["end_us"]) for p in phases if p["phase"] == "forward"]
    bwd = [(p["start_us"], p["end_us"]) for p in phases if p["phase"] == "backward"]
    inst = rank.get("instances") or {}
    every = sorted(_calls(inst, ""))
    reduce, bcast = _calls(inst, "all_reduce"), _calls(inst, "broadcast")
    analysed = [(b0, b1) for b0, b1 in bwd if any(b0 <= c[0] <= b1 for c in reduce)]
    rows = rank.get("per_step") or []
    if len(rows) != len(analysed):
        rows = [None] * len(analysed)  # steps not matched: no exposed time per step
    out = []
    for (b0, b1), row in zip(analysed, rows, strict=True):
        mine = [c for c in reduce if b0 <= c[0] <= b1]
        if len(mine) != n_buckets:
            continue
        before = [e for s, e in every if e <= mine[0][0]]
        ends = [before[-1] if before else None] + [e for _, e in mine[:-1]]
        f0, f1 = max((f for f in fwd if f[0] <= b0), default=(b0, b0))
        bc = [e - s for s, e in bcast if f0 <= s <= f1]
        # backward waits for its buckets: a call's span past backward's end is the worker's
        # bookkeeping after the wait returned, not time the step waited
        cut = [min(e, b1) for _, e in mine]
        finalize = b1 - cut[-1]
        exposed = None if row is None else max(0.0, row["exposed_comm_us"] - sum(bc))
        pre = None if exposed is None else (b1 - b0) - exposed - finalize
        out.append({
            "start_us": [s - b0 for s, _ in mine],
            "latency_us": [c - s for (s, _), c in zip(mine, cut, strict=True)],
            "gap_us": [None if p is None else s - p for (s, _), p in zip(mine, ends, strict=True)],
            "broadcast_us": bc,
            "finalize_us": finalize,
            "lead_us": [None if pre is None else pre - (s - b0) for s, _ in mine],
            "exposed_us": None if row is None else row["exposed_comm_us"],
            "step_us": None if row is None else row["step_time_us"],
        })  # fmt: skip
    return out


def bucket_calls(ranks: list[dict], n_buckets: int) -> dict | None:
    """{steps, exposed_share, bucket_us, bucket_lead_us, finalize_us, bucket_start_us,
    bucket_gaps_us, broadcast_us, step_time_us} of the module docstring, traced µs; the share,
    the leads, the finalize, the starts (from the start of backward) and the gaps on the rank that
    issued the step's last bucket last (the one the step waited for; `exposed_share` its exposed
    comm ÷ its step, None when the steps are not matched; `step_time_us` those steps' mean, else
    every rank's traced mean step: the scale to unprofiled steps); None when no step of every
    rank has `n_buckets` all-reduce calls in its backward."""
    per_rank = [_rank_steps(r, n_buckets) for r in ranks]
    steps = min((len(p) for p in per_rank), default=0)
    if steps == 0:
        return None
    lat = np.array([[p[i]["latency_us"] for i in range(steps)] for p in per_rank])  # r, i, k
    frame = [per_rank[r][i] for i, r in enumerate(lat[:, :, -1].argmin(axis=0))]
    bc = [f["broadcast_us"] for f in frame]  # the frame rank's, as its exposed time holds them
    width = min(len(b) for b in bc)

    def per_bucket(key: str) -> list[float | None]:
        return [_mean([f[key][k] for f in frame]) for k in range(n_buckets)]

    exposed = [f["exposed_us"] for f in frame]
    share, step_us = None, float(np.mean([r["step_time_us_mean"] for r in ranks]))
    if None not in exposed:  # the step's exposed comm is that of the rank it waited for
        step_us = float(np.mean([f["step_us"] for f in frame]))
        share = float(np.mean(exposed)) / step_us
    return {
        "steps": steps,
        "exposed_share": share,
        "bucket_us": lat.min(axis=0).mean(axis=0).tolist(),
        "bucket_lead_us": per_bucket("lead_us"),
        "finalize_us": float(np.mean([f["finalize_us"] for f in frame])),
        "bucket_start_us": per_bucket("start_us"),
        "bucket_gaps_us": per_bucket("gap_us"),
        "broadcast_us": np.mean([b[:width] for b in bc], axis=0).tolist() if width else [],
        "step_time_us": step_us,
    }


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None
