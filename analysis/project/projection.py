"""Scaling projection: what a measured training run would do at n ranks (`analysis project`).

Model (docs/reference/metrics.md, "Scaling projection"), per projected world size n:
- compute: data, forward, backward and optimizer seconds per step from RUN's unprofiled,
  non-warm-up steps (steps.csv), plus the loop's remainder. Strong scaling gives each rank
  global ÷ n samples; data, forward and backward scale linearly with the per-device batch (an
  assumption, unless a measured run at that batch is given), optimizer and the remainder do not.
  Weak scaling keeps the per-device batch. For a DDP RUN, backward compute = its backward time
  minus the exposed communication its traces measured.
- communication: DDP's gradient buckets (run.json metrics.ddp, or computed from
  metrics.param_grad_bytes the way DDP's reducer assigns buckets), each all-reduced with the α–β
  model of a comm run (analysis.project.comm), hierarchical past one node: ring all-reduce inside the node
  plus ring all-reduce between nodes over the inter-node link (bytes per node ÷ link bandwidth).
  Buckets run one after another on one stream; bucket k may start once backward has produced its
  gradients (at backward × its cumulative share of gradient bytes) and bucket k−1 is done.
  Bandwidth per size comes from the comm run's mean times when it has them (a mean step is what is
  projected), timed after as much compute as the comm run's `--gap-ms` says.
- buffer broadcast: DDP broadcasts the module's buffers at every forward, one call per dtype, with
  the comm run's broadcast model; nothing overlaps it.
- straggler wait: the step waits for the slowest of n ranks, E[max of n independent draws] of
  RUN's per-step compute minus the same at RUN's own n (zero for the replay).
- step = compute + straggler wait + exposed communication (still running when backward ends, plus
  the buffer broadcast).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.project.comm import (
    contention_factor,
    fit_alpha_beta,
    load_comm_run,
    with_measured_curve,
)
from analysis.project.inputs import load_training, unprofiled_steps
from analysis.project.model import (
    INTER_NODE_ALPHA_US,
    ProjectionInputs,
    assumptions,
    parse_inter_node,
)
from analysis.project.step import predict_step
from profiler.runfolder.errors import InputError
from profiler.runfolder.hostload import is_busy
from profiler.runfolder.versions import PROJECTION_JSON_SCHEMA_VERSION

__all__ = ["load_training", "project", "unprofiled_steps"]  # the inputs re-exported


def project(
    run_dir: Path,
    comm_dir: Path,
    ranks: list[int],
    *,
    gpus_per_node: int = 8,
    inter_node: str = "100",
    scaling: str | None = None,
    backend: str | None = None,
    measured: list[Path] = (),
    batch_runs: list[Path] = (),
    traces: bool = True,
    wire_bytes_factor: float | None = None,
    trace: dict | None = None,
    bandwidth: str = "measured",
) -> dict:
    """The projection JSON for RUN at each n in `ranks` (see the module docstring).

    `wire_bytes_factor` overrides the bytes on the wire per gradient byte (default: 0.5 when RUN
    used the fp16/bf16 comm hook, else 1), e.g. 0.5 to ask what the fp16 hook would give.
    `bandwidth`: `measured` = α from the fit, bus bandwidth per message size from the benchmark
    (analysis.project.comm.with_measured_curve); `fit` = the single fitted (α, B) pair."""
    inter_gbps = _check_args(ranks, gpus_per_node, inter_node)
    run = load_training(run_dir, traces=traces, trace=trace)
    comm = load_comm_run(comm_dir)
    asked = backend or (run.backend if run.mode == "ddp" else comm["backend"])
    _check_comm(comm, comm_dir, asked, bandwidth)
    model = _comm_model(comm, "all_reduce", bandwidth)
    bcast = _comm_model(comm, "broadcast", bandwidth) if "broadcast" in comm["models"] else None
    scaling = scaling or run.scaling
    wire = wire_bytes_factor or (0.5 if run.comm_hook in ("fp16", "bf16") else 1.0)
    warnings = _warnings(run, comm, model, bcast, wire, bandwidth, ranks, gpus_per_node)
    others = (load_training(d, traces=traces) for d in batch_runs)
    by_batch = {other.per_device_batch: other for other in others}
    kw = dict(scaling=scaling, comm_model=model, gpn=gpus_per_node, inter_gbps=inter_gbps)
    kw.update(batch_runs=by_batch, wire=wire, bcast=bcast, host=comm["host_contention"])
    base, preds = _predictions(run, ranks, kw)
    checks = [_check(run, load_training(d, traces=False), kw, base) for d in measured]
    idle = "idle_penalty" in model
    host = _host_words(comm, ranks, gpus_per_node, run)
    return {
        "schema_version": PROJECTION_JSON_SCHEMA_VERSION,
        "run_id": run.run_id,
        "run_path": run.path,
        "comm_run_id": comm["run_id"],
        "backend": asked,
        "scaling": scaling,
        "ranks": list(ranks),
        "inputs": _inputs_json(run, comm, kw, bandwidth),
        "assumptions": assumptions(
            scaling, run, gpus_per_node, inter_gbps, by_batch, bandwidth, idle=idle, host=host
        ),
        "replay": _check(run, run, kw, base),
        "measured": checks,
        "predictions": preds,
        "warnings": warnings,
    }


def _check_args(ranks: list[int], gpus_per_node: int, inter_node: str) -> float:
    """One line (InputError) for a bad argument; the inter-node link in Gb/s."""
    if not ranks or any(n < 1 for n in ranks):
        raise InputError("--ranks", f"got {ranks}", "every world size must be >= 1")
    if gpus_per_node < 1:
        raise InputError("--gpus-per-node", f"got {gpus_per_node}", "pass a count >= 1")
    return parse_inter_node(inter_node)


def _predictions(run: ProjectionInputs, ranks: list[int], kw: dict) -> tuple[dict, list[dict]]:
    """The one-rank projection (the speedup's base) and the projection at each n in `ranks`."""
    base = predict_step(run, 1, **kw)
    preds = []
    for n in ranks:
        p = predict_step(run, n, **kw)
        p["speedup"] = p["samples_per_s"] / base["samples_per_s"]
        p["scaling_efficiency"] = p["speedup"] / n
        preds.append(p)
    return base, preds


def _check_comm(comm: dict, comm_dir: Path, asked: str | None, bandwidth: str) -> None:
    """One line (InputError) unless the comm run can model `asked`'s collectives."""
    if comm["backend"] != asked:
        raise InputError(
            comm_dir,
            f"benchmarks {comm['backend']}, not the {asked} asked for",
            f"pass a comm run made with BACKEND={asked}",
        )
    if comm["status"] != "ok" or int(comm["world_size"] or 0) < 2:
        raise InputError(
            comm_dir,
            f"is not a finished benchmark over >= 2 ranks (status {comm['status']}, "
            f"{comm['world_size']} rank(s): nothing was transferred)",
            "run make bench-comm with NPROC >= 2",
        )
    if "all_reduce" not in comm["models"]:
        raise InputError(comm_dir, "has no all_reduce fit", "re-run make bench-comm")
    if bandwidth not in ("measured", "fit"):
        raise InputError("--bandwidth", f"got {bandwidth!r}", "use measured or fit")


def _warnings(
    run: ProjectionInputs,
    comm: dict,
    model: dict,
    bcast: dict | None,
    wire: float,
    bandwidth: str,
    ranks: list[int],
    gpus_per_node: int,
) -> list[str]:
    """The run's own warnings, then what the projection leaves out or extrapolates."""
    warnings = list(run.warnings)
    load = comm["host_load"]
    if is_busy(load):  # the report's busy-run rule (THRESHOLDS busy_other_cores_frac)
        warnings.append(
            f"the comm run was measured while other processes used "
            f"{load['other_cpu_cores_mean']:.1f} of {load['cores']} cores: its idle penalties and "
            "host contention are unreliable; re-run make bench-comm on an idle machine"
        )
    if run.buffer_groups_bytes and bcast is None:
        warnings.append(
            "the comm run has no broadcast: DDP's per-forward buffer broadcast is left out"
        )
    big = [b for b in run.buckets_bytes if b * wire > model["bytes_max"]]
    if big:
        warnings.append(
            f"buckets of {', '.join(map(str, big))} B exceed the largest benchmarked size "
            f"({model['bytes_max']} B): extrapolated "
            + ("with the α–β fit" if bandwidth == "fit" else "at the largest size's bandwidth")
        )
    if any(n > gpus_per_node and n % gpus_per_node for n in ranks):
        warnings.append(
            "world sizes past one node that are not multiples of --gpus-per-node "
            "are modelled with a partly filled last node counted as full"
        )
    return warnings


def _inputs_json(run: ProjectionInputs, comm: dict, kw: dict, bandwidth: str) -> dict:
    """The projection JSON's `inputs`: what was measured and every setting the model used."""
    model = kw["comm_model"]
    return {
        "mode": run.mode,
        "world_size": run.world_size,
        "model": run.model,
        "dataset": run.dataset,
        "per_device_batch": run.per_device_batch,
        "global_batch": run.global_batch,
        "threads_per_rank": run.threads_per_rank,
        "steps_used": run.steps_used,
        "measured_step_time_s": run.step_time_s,
        "phases_s": run.phases_s,
        "other_s": run.other_s,
        "backward_compute_s": run.backward_compute_s,
        "traced_exposed_comm_s": run.traced_exposed_comm_s,
        "buckets_bytes": run.buckets_bytes,
        "buffer_broadcasts_bytes": run.buffer_groups_bytes,
        "bucket_source": run.bucket_source,
        "comm_hook": run.comm_hook,
        "wire_bytes_factor": kw["wire"],
        "all_reduce_model": model,
        "bandwidth_source": bandwidth,
        "comm_time_statistic": model.get("time_statistic", "median"),
        "comm_gap_ms": comm["gap_ms"],
        "idle_penalty_gaps_ms": (model.get("idle_penalty") or {}).get("gap_ms", []),
        "host_contention": comm["host_contention"],
        "gpus_per_node": kw["gpn"],
        "inter_node_gbps": kw["inter_gbps"],
        "inter_node_alpha_us": INTER_NODE_ALPHA_US,
    }


def _comm_model(comm: dict, name: str, bandwidth: str) -> dict:
    """The α–β model of `name` from the comm run (docs/reference/metrics.md §10), with the comm run's
    `idle_penalty` table (analysis.project.comm.idle_table) when it has one. With `measured`
    bandwidth, the per-size curve of the benchmark's mean times (a mean step is what is projected:
    heavy-tailed collective times make the median too low), or of its medians for comm runs
    without means. A comm run from before the gap sweep, timed after one gap with back-to-back
    means: α, B and the curve from those back-to-back means."""
    model = _bandwidth_model(comm, name, bandwidth)
    if name in comm["idle"]:
        model["idle_penalty"] = comm["idle"][name]
    return model


def _bandwidth_model(comm: dict, name: str, bandwidth: str) -> dict:
    n0 = comm["models"][name]["world_size"]
    model = dict(comm["models"][name], time_statistic="median")
    means = comm["means"].get(name)
    if means is None or len(means["bytes"]) < 2:
        if bandwidth == "fit":
            return model
        rows = pd.DataFrame(comm["rows"])
        rows = rows[rows["collective"] == name]
        return with_measured_curve(model, rows["bytes"], rows["time_us_median"])
    hot = means.get("time_us_mean_back_to_back")
    if hot is None:  # back-to-back timing: the means as they are
        if bandwidth == "fit":
            return model
        curve = with_measured_curve(model, means["bytes"], means["time_us_mean"])
        return dict(curve, time_statistic="mean")
    model = dict(fit_alpha_beta(name, n0, means["bytes"], hot), time_statistic="mean")
    return model if bandwidth == "fit" else with_measured_curve(model, means["bytes"], hot)


def _host_words(comm: dict, ranks: list[int], gpn: int, run: ProjectionInputs) -> str:
    """The contention assumption with its measured values (analysis.project.step)."""
    host = comm["host_contention"]
    if not host.get("slowdown"):
        return host.get("note") or (
            "host contention not measured by this comm run (GPU, or a run from before the "
            "measurement): compute factor 1"
        )
    at = sorted({min(n, gpn) for n in [run.world_size, *ranks]})
    vals = ", ".join(f"×{contention_factor(host, k):.3f} at {k}" for k in at)
    far = " (flat past the measured counts)" if at[-1] > host["ranks"][-1] else ""
    return (
        f"co-located ranks slow each other's compute, measured by the comm run: {vals} ranks "
        f"per node{far}; compute scaled by c(n) ÷ c(RUN's ranks per node)"
    )


def _check(run: ProjectionInputs, target: ProjectionInputs, kw: dict, base: dict) -> dict:
    """Projection of `run` at `target`'s world size vs `target`'s measured unprofiled step time;
    `measured_scaling_efficiency` divides by the same projected n = 1 throughput as predictions."""
    n = target.world_size
    measured_sps = target.global_batch / target.step_time_s
    p = predict_step(run, n, **kw)
    err = 100 * (p["step_time_s"] - target.step_time_s) / target.step_time_s
    note = None
    if target is run and n == 1:
        note = (
            "single-device run: no communication to model, so the replay is exact by construction"
        )
    if abs(p["per_device_batch"] - target.per_device_batch) > 1e-9:
        note = f"per-device batch differs ({p['per_device_batch']:g} vs {target.per_device_batch})"
    return {
        "run_id": target.run_id,
        "ranks": n,
        "measured_step_time_s": target.step_time_s,
        "predicted_step_time_s": p["step_time_s"],
        "error_pct": err,
        "measured_samples_per_s": measured_sps,
        "measured_scaling_efficiency": measured_sps / base["samples_per_s"] / n,
        "note": note,
    }
