"""One projected step at n ranks (definitions: docs/reference/metrics.md §10, "Projection").

- compute: the run's phases at the projected per-device batch (analysis.project.model
  .compute_phases), times the host-contention ratio c(ranks per node at n) ÷ c(ranks per node of
  the run), c measured by the comm run (1 on GPU, analysis.project.comm.contention_factor).
- gradient buckets: all-reduced one after another on one stream; bucket k starts at
  max(ready_k, end of bucket k−1), ready_k = backward × its cumulative share of gradient bytes.
  Its gap is start_k − the end of the collective before it (for the first bucket: the compute
  since the step's previous collective, the buffer broadcast at forward's start when the model
  has buffers, else the previous step's last bucket); it takes the α–β time plus the comm run's
  idle penalty at that gap and its size (analysis.project.comm.idle_penalty_us), less the ranks'
  arrival skew (analysis.project.model.arrival_skew_s), at least 0: the sweep times ranks that
  arrive together, and in a step the early ranks' transports wake while they wait.
- buffer broadcast: one call per buffer dtype at the start of forward, nothing overlapping it;
  the first after the compute since the step's last bucket, the others back-to-back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from analysis.project.comm import contention_factor, idle_penalty_us
from analysis.project.model import (
    ProjectionInputs,
    arrival_skew_s,
    compute_phases,
    hierarchical_us,
    straggler_s,
)

__all__ = ["POINT", "Knobs", "bucket_timeline", "contention_ratio", "predict_step"]


def bucket_timeline(
    ready_s: list[float],
    comm_s: list[float],
    *,
    lead_s: float = 0.0,
    penalty: Callable[[int, float], float] | None = None,
    lanes: int = 1,
) -> list[tuple[float, float, float]]:
    """(start, gap, duration) of each bucket's all-reduce, seconds after backward starts: bucket
    k starts at max(ready_k, the time one of `lanes` is free: with 1, the end of k−1); its gap =
    start − when that lane's call before it ended (the first one's: −`lead_s`); duration =
    comm_s[k] + penalty(k, gap)."""
    out, free = [], [-lead_s] * max(1, lanes)
    for k, (ready, dur) in enumerate(zip(ready_s, comm_s, strict=True)):
        lane = int(np.argmin(free))
        start = max(ready, free[lane])
        gap = start - free[lane]
        dur += penalty(k, gap) if penalty else 0.0
        out.append((start, gap, dur))
        free[lane] = start + dur
    return out


def _calls_s(sizes: list[float], n: int, gpn: int, model: dict, inter_gbps: float) -> list[float]:
    """α–β seconds of each call (hierarchical past one node); 0 at one rank."""
    if n < 2:
        return [0.0] * len(sizes)
    return [hierarchical_us(b, n, gpn, model, inter_gbps) / 1e6 for b in sizes]


def _paid_s(model: dict, nbytes: float, gap_s: float, scale: float, hidden_s: float) -> float:
    """The idle penalty (s) a call of `nbytes` pays after `gap_s`: the comm model's × `scale`,
    less the `hidden_s` its peers' transports spent awake waiting for it, at least 0."""
    return max(0.0, scale * idle_penalty_us(model, nbytes, 1e3 * gap_s) / 1e6 - hidden_s)


def _penalty(
    model: dict, sizes: list[float], scale: float, hidden_s: float
) -> Callable[[int, float], float]:
    """Bucket k's idle penalty (s) at its gap (s): _paid_s."""
    return lambda k, gap_s: _paid_s(model, sizes[k], gap_s, scale, hidden_s)


def contention_ratio(
    run: ProjectionInputs, n: int, gpn: int, host: dict, which: str = "slowdown"
) -> float:
    """c(ranks per node at n) ÷ c(ranks per node of the run): the run's compute already carries
    the contention of its own co-located ranks (1 exactly at the run's own ranks per node).
    `which`: the median slowdown, or the comm run's `slowdown_min` / `slowdown_max`."""
    at, own = min(n, gpn), min(run.world_size, gpn)
    if at == own:
        return 1.0
    return contention_factor(host, at, which) / contention_factor(host, own, which)


def _broadcasts(groups: list[int], after_s: float, n: int, kw: dict, penalty: tuple[float, float],
                traced: list[float] | None) -> tuple[float, float]:  # fmt: skip
    """(seconds, idle-penalty seconds) of the buffer broadcasts that open forward: the first
    after `after_s` of compute since the last bucket, the others back-to-back; `penalty`: (scale,
    hidden seconds) as _paid_s takes them; `traced`: the run's own traced broadcast times instead
    of the comm model."""
    if traced is not None:
        return float(sum(traced)), 0.0
    bcast = kw["bcast"]
    calls = _calls_s(groups, n, kw["gpn"], bcast, kw["inter_gbps"])
    gaps_s = [after_s] + [0.0] * (len(groups) - 1)
    pens = [_paid_s(bcast, b, g, *penalty) for b, g in zip(groups, gaps_s, strict=True)]
    return sum(calls) + sum(pens), sum(pens)


@dataclass(frozen=True)
class Knobs:
    """Where predict_step takes its measured inputs (analysis.project.bands: the band's ends)."""

    compute_scale: float = 1.0
    """Every compute phase × this."""
    contention: str = "slowdown"
    """The contention factor: the median `slowdown`, or `slowdown_min` / `slowdown_max`."""
    penalty_scale: float = 1.0
    """Every idle penalty × this."""
    skew_hides: bool = True
    """The ranks' arrival skew hides that much of each idle penalty (False: all of it paid)."""


POINT = Knobs()


def _gradient_timeline(sizes: list[float], backward: float, lead: float, n: int, model: tuple,
                       traced: dict | None) -> tuple[list, list[float], float]:  # fmt: skip
    """(bucket_timeline, the buckets' comm seconds, the backward compute before the comm): ready
    times in proportion to the bytes and the comm model's calls with their idle penalties
    (`model` = (comm model, gpn, inter-node Gb/s, (penalty scale, hidden s))), or the traced
    ones."""
    total = sum(sizes)
    ready = list(np.cumsum(sizes) / total * backward) if total else []
    if traced is not None:
        pre = backward
        if traced.get("ready_s") is not None:
            ready, pre = list(traced["ready_s"]), backward - traced["finalize_s"]
        comm = list(traced["bucket_s"])
        lanes = traced.get("lanes", 1)
        return bucket_timeline(ready, comm, lead_s=lead, lanes=lanes), comm, pre
    comm_model, gpn, inter_gbps, penalty = model
    comm = _calls_s(sizes, n, gpn, comm_model, inter_gbps)
    pen = _penalty(comm_model, sizes, *penalty) if n > 1 else None
    return bucket_timeline(ready, comm, lead_s=lead, penalty=pen), comm, backward


def predict_step(run: ProjectionInputs, n: int, *, scaling: str, comm_model: dict, gpn: int,
                 inter_gbps: float, batch_runs: dict, wire: float, bcast: dict | None,
                 host: dict, knobs: Knobs = POINT, traced: dict | None = None) -> dict:  # fmt: skip
    """The projected step of `run` at `n` ranks (the module docstring), seconds per step, with
    its inputs where `knobs` says. `traced` ({bucket_s, broadcast_s}, the run's own traced calls
    at its own n; with `ready_s` and `finalize_s`, when each bucket started and the backward
    compute after the last one; `lanes`, how many ran at once): those times instead of the comm
    model's, no idle penalty on top, and the exposure counted from the end of the backward
    compute before the finalize."""
    batch = run.global_batch / n if scaling == "strong" else run.per_device_batch
    ph, source = compute_phases(run, batch, batch_runs, n)
    ratio = contention_ratio(run, n, gpn, host, knobs.contention)
    ph = {k: v * ratio * knobs.compute_scale for k, v in ph.items()}
    compute = sum(ph.values())
    sizes = [b * wire for b in run.buckets_bytes]
    groups = run.buffer_groups_bytes if bcast or traced else []
    lead = ph["forward"] if groups else compute - ph["backward"]
    multi = n > 1
    # the skew and the straggler wait scale like the compute they come from
    per_compute = compute / run.compute_s if run.compute_s else 1.0
    hidden = arrival_skew_s(run, n) * per_compute if knobs.skew_hides else 0.0
    penalty = (knobs.penalty_scale, hidden)
    line, comm, pre = _gradient_timeline(
        sizes, ph["backward"], lead, n, (comm_model, gpn, inter_gbps, penalty), traced
    )
    end = max((start + dur for start, _, dur in line), default=0.0)
    exposed = max(0.0, end - pre) if multi else 0.0
    idle = sum(d for _, _, d in line) - sum(comm)
    broadcast = 0.0
    if groups and multi:  # the first after the compute since the last bucket, then back-to-back
        kw = {"bcast": bcast, "gpn": gpn, "inter_gbps": inter_gbps}
        after = compute - ph["forward"] - ph["backward"]
        broadcast, pens = _broadcasts(groups, after, n, kw, penalty,
                                      traced["broadcast_s"] if traced else None)  # fmt: skip
        idle += pens
    wait = straggler_s(run, n) * per_compute if multi else 0.0  # the slowest rank's compute
    step = compute + wait + exposed + broadcast
    return {
        "ranks": n,
        "per_device_batch": batch,
        "global_batch": batch * n,
        "compute_source": source,
        "step_time_s": step,
        "compute_s": compute,
        "contention_factor": ratio,
        "comm_s": float(sum(d for _, _, d in line)) + broadcast if multi else 0.0,
        "idle_penalty_s": idle if multi else 0.0,
        "exposed_comm_s": exposed + broadcast,
        "buffer_broadcast_s": broadcast,
        "straggler_s": wait,
        "exposed_comm_pct": 100 * (exposed + broadcast) / step if step else 0.0,
        "samples_per_s": batch * n / step,
        "bucket_gaps_ms": [1e3 * g for _, g, _ in line] if multi else [],
    }
