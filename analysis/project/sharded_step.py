"""One projected step of a ZeRO-1 or FSDP2 run at n ranks (definitions: docs/reference/metrics.md
§10, "ZeRO-1 and FSDP2"). Pure arithmetic over the inputs analysis.project.sharded reads.

- **compute**: the run's phases less the communication its traces measured exposed in each
  phase, at the projected per-device batch (data, forward and backward linear in it, as for
  DDP), times the host-contention ratio; the optimizer step works on this rank's share of the
  parameters: FSDP2's shards scale it by run ranks ÷ n, ZeRO-1's whole parameters as below.
- **FSDP2**: one collective stream, calls run in the order they are issued. Forward, in module
  order (the root group first): each group's all-gather (its unsharded bytes) must end before
  its compute (the forward time × its share of the parameters) starts; the next group's
  all-gather is issued at the start of the current group's compute where the device prefetches
  (CUDA streams), at its end on CPU (gloo, measured: no forward prefetch). Backward, in reverse:
  with reshard_after_forward each non-root group is all-gathered again, prefetched one group
  ahead (issued when the previous group's backward starts); each group's gradients are
  reduce-scattered when its backward ends. The step ends when the last reduce-scatter and the
  last backward are done, then the optimizer.
- **ZeRO-1**: DDP's step (analysis.project.step.predict_step: buckets all-reduced under
  backward), its optimizer step scaled by the fullest rank's share of the parameters under
  ZeroRedundancyOptimizer's partition (whole parameters, largest first to the least-loaded rank)
  at n vs at the run's ranks, then each parameter broadcast from the rank that owns its
  optimizer state, one call per parameter after the optimizer step, nothing overlapping them.
- Every call takes the α–β time of the algorithm that moves its bytes (analysis.trace.c10d):
  gloo runs a reduce-scatter as an all-reduce, so the comm run's all_reduce model times it.
- straggler wait: E[max of n draws] of the run's per-step compute minus the same at its own n.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from analysis.project.model import ProjectionInputs, expected_max, hierarchical_us
from analysis.project.step import predict_step

__all__ = ["fsdp_step", "fsdp_timeline", "zero_step"]

CallTime = Callable[[str, float], float]
"""(collective, bytes) -> seconds at the projected n."""


def fsdp_timeline(
    groups: list[dict],
    forward_s: float,
    backward_s: float,
    call: CallTime,
    *,
    reshard: bool,
    prefetch_forward: bool,
) -> dict[str, float]:
    """Forward and backward of an FSDP2 step on one collective stream (the module docstring):
    {end_s, all_gather_s, reduce_scatter_s}; `groups` in forward order, each with `module` ("" =
    the root), `numel` and `unsharded_bytes`."""
    total = sum(g["numel"] for g in groups) or 1
    free = 0.0  # when the stream is next idle
    spent = {"all_gather": 0.0, "reduce_scatter": 0.0}

    def run(kind: str, issue: float, nbytes: float) -> float:
        nonlocal free
        dur = call(kind, nbytes)
        spent[kind] += dur
        free = max(free, issue) + dur
        return free

    t, ready = 0.0, run("all_gather", 0.0, groups[0]["unsharded_bytes"]) if groups else 0.0
    for i, g in enumerate(groups):
        start = max(t, ready)
        end = start + forward_s * g["numel"] / total
        if i + 1 < len(groups):
            issue = start if prefetch_forward else end
            ready = run("all_gather", issue, groups[i + 1]["unsharded_bytes"])
        t = end
    back = list(reversed(groups))

    def gather(g: dict, issue: float) -> float:
        return run("all_gather", issue, g["unsharded_bytes"]) if reshard and g["module"] else issue

    ready = gather(back[0], t) if back else t
    for i, g in enumerate(back):
        start = max(t, ready)
        if i + 1 < len(back):  # the next group's all-gather, prefetched now
            ready = gather(back[i + 1], start)
        t = start + backward_s * g["numel"] / total
        run("reduce_scatter", t, g["unsharded_bytes"])
    return {"end_s": max(t, free), **{f"{k}_s": v for k, v in spent.items()}}


def fullest_share(param_bytes: list[int], n: int) -> float:
    """The fullest rank's share of the parameters under ZeroRedundancyOptimizer's partition:
    largest first, each to the least-loaded rank (torch's `_partition_parameters`)."""
    loads = [0] * max(1, n)
    for b in sorted(param_bytes, reverse=True):
        loads[loads.index(min(loads))] += b
    return max(loads) / (sum(param_bytes) or 1)


def _straggler_s(samples, n: int, world: int) -> float:
    if samples.size == 0 or n <= world:
        return 0.0
    return max(0.0, expected_max(samples, n) - expected_max(samples, world))


def call_time(models: dict[str, dict], n: int, gpn: int, inter_gbps: float) -> CallTime:
    """Seconds of one call of `collective` moving `nbytes` at n ranks, with the comm run's model
    of the algorithm that moves them (`models`: collective -> α–β model)."""

    def seconds(collective: str, nbytes: float) -> float:
        if n < 2:
            return 0.0
        return hierarchical_us(nbytes, n, gpn, models[collective], inter_gbps) / 1e6

    return seconds


def fsdp_step(inp, n: int, batch: float, ratio: float, call: CallTime) -> dict:
    """The projected FSDP2 step at n (the module docstring); `ratio` is the contention ratio,
    `inp` an analysis.project.sharded.ShardedInputs."""
    k = batch / inp.per_device_batch
    ph = {
        "data": inp.compute_phases_s["data"] * k * ratio,
        "forward": inp.compute_phases_s["forward"] * k * ratio,
        "backward": inp.compute_phases_s["backward"] * k * ratio,
        "optimizer": inp.compute_phases_s["optimizer"] * inp.world_size / n * ratio,
        "other": inp.other_s,
    }
    line = fsdp_timeline(
        inp.groups,
        ph["forward"],
        ph["backward"],
        call,
        reshard=inp.reshard_after_forward,
        prefetch_forward=inp.device_type == "cuda",
    )
    compute = sum(ph.values())
    wait = _straggler_s(inp.step_samples_s, n, inp.world_size) * compute / inp.compute_s
    step = line["end_s"] + ph["data"] + ph["optimizer"] + ph["other"] + wait
    exposed = step - compute - wait
    comm = line["all_gather_s"] + line["reduce_scatter_s"]
    return _prediction(n, batch, step, compute, ratio, comm, exposed, wait, line)


def zero_step(inp, n: int, batch: float, ddp_kw: dict, call: CallTime) -> dict:
    """The projected ZeRO-1 step at n (the module docstring); `ddp_kw` are predict_step's
    keyword arguments, `inp` an analysis.project.sharded.ShardedInputs with its DDP part."""
    ddp: ProjectionInputs = inp.ddp
    share = fullest_share(inp.param_bytes, n) / fullest_share(inp.param_bytes, inp.world_size)
    phases = dict(ddp.phases_s, optimizer=inp.compute_phases_s["optimizer"] * share)
    scaled = dataclasses.replace(ddp, phases_s=phases)
    p = predict_step(scaled, n, **ddp_kw)
    bcast = sum(call("broadcast", b) for b in inp.param_bytes)
    step = p["step_time_s"] + bcast
    extra = {"broadcast_s": bcast, "all_reduce_s": p["comm_s"] - p["buffer_broadcast_s"]}
    out = _prediction(n, batch, step, p["compute_s"], p["contention_factor"],
                      p["comm_s"] + bcast, p["exposed_comm_s"] + bcast, p["straggler_s"], extra)  # fmt: skip
    out.update(idle_penalty_s=p["idle_penalty_s"], buffer_broadcast_s=p["buffer_broadcast_s"],
               bucket_gaps_ms=p["bucket_gaps_ms"], compute_source=p["compute_source"])  # fmt: skip
    return out


def _prediction(n, batch, step, compute, ratio, comm, exposed, wait, parts) -> dict:  # noqa: ANN001
    """One `predictions` item, with the keys the DDP projection's have."""
    return {
        "ranks": n,
        "per_device_batch": batch,
        "global_batch": batch * n,
        "compute_source": "measured",
        "step_time_s": step,
        "compute_s": compute,
        "contention_factor": ratio,
        "comm_s": comm if n > 1 else 0.0,
        "idle_penalty_s": 0.0,
        "exposed_comm_s": max(0.0, exposed) if n > 1 else 0.0,
        "buffer_broadcast_s": 0.0,
        "straggler_s": wait,
        "exposed_comm_pct": 100 * max(0.0, exposed) / step if step and n > 1 else 0.0,
        "samples_per_s": batch * n / step,
        "bucket_gaps_ms": [],
        **{k: v for k, v in parts.items() if k.endswith("_s") and k != "end_s"},
    }
