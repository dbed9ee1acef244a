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
- band: the same projection with every measured spread at its low and at its high end
  (analysis.project.bands); `replay_traced`: a DDP RUN at its own n with its own traced per-bucket
  times instead of the comm model (analysis.project.traced), which checks the arithmetic alone.
"""

from __future__ import annotations

import math
from pathlib import Path

from analysis.project.bands import band_fields, comm_model, comm_models, compute_spread
from analysis.project.checks import check as _check
from analysis.project.checks import replay_traced as _replay_traced
from analysis.project.comm import contention_factor, load_comm_run
from analysis.project.inputs import load_training, unprofiled_steps
from analysis.project.model import (
    INTER_NODE_ALPHA_US,
    ProjectionInputs,
    assumptions,
    parse_inter_node,
)
from analysis.project.step import Knobs, predict_step
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
    workload_runs: list[Path] = (),
    traces: bool | dict = True,
    wire_bytes_factor: float | None = None,
    bandwidth: str = "measured",
) -> dict:
    """The projection JSON for RUN at each n in `ranks` (see the module docstring):
    `wire_bytes_factor` overrides the bytes on the wire per gradient byte (default: 0.5 when RUN
    used the fp16/bf16 comm hook, else 1), e.g. 0.5 to ask what the fp16 hook would give.
    `bandwidth`: `measured` = α from the fit, bus bandwidth per message size from the benchmark
    (analysis.project.comm.with_measured_curve); `fit` = the single fitted (α, B) pair.
    `workload_runs`: other runs of RUN's workload (model, dataset, per-device batch): those of
    its mode and world size (other seeds) widen the compute band; a 1-rank DDP run, for a
    single-device RUN, gives the compute at n ≥ 2 (`ProjectionInputs.ddp1`). `traces`: read a
    DDP RUN's traces (True), not (False), or a dict: an already computed traces JSON of RUN (its
    exposed share; no self-replay then). InputError (one line) for bad input, and for a run
    whose numbers give no finite projection ("cannot project")."""
    inter_gbps = _check_args(ranks, gpus_per_node, inter_node)
    given = traces if isinstance(traces, dict) else None
    run = load_training(run_dir, traces=bool(traces), trace=given)
    comm = load_comm_run(comm_dir)
    asked = backend or (run.backend if run.mode == "ddp" else comm["backend"])
    model, bcast = _comm_models(comm, comm_dir, asked, bandwidth)
    scaling = scaling or run.scaling
    wire = wire_bytes_factor or (0.5 if run.comm_hook in ("fp16", "bf16") else 1.0)
    others = (load_training(d, traces=bool(traces)) for d in batch_runs)
    by_batch = {other.per_device_batch: other for other in others}
    kw = dict(scaling=scaling, comm_model=model, gpn=gpus_per_node, inter_gbps=inter_gbps)
    kw.update(batch_runs=by_batch, wire=wire, bcast=bcast, host=comm["host_contention"])
    seeds = _workload_runs(run, workload_runs, bool(traces))
    ends = _band_ends(run, comm, kw, bandwidth, seeds)
    base, preds = _predictions(run, ranks, kw, ends)
    out = {
        "schema_version": PROJECTION_JSON_SCHEMA_VERSION,
        "run_id": run.run_id,
        "run_path": run.path,
        "comm_run_id": comm["run_id"],
        "backend": asked,
        "scaling": scaling,
        "ranks": list(ranks),
        "inputs": _inputs_json(run, comm, kw, bandwidth),
        "assumptions": _assumptions(run, comm, ranks, kw, bandwidth),
        "replay": _check(run, run, kw, base, ends),
        "replay_traced": _replay_traced(run, kw),
        "measured": [_check(run, load_training(d, traces=False), kw, base, ends) for d in measured],
        "predictions": preds,
        "warnings": _warnings(run, comm, model, bcast, wire, bandwidth, ranks, gpus_per_node),
    }
    _check_finite(out, run_dir)
    return out


def _comm_models(comm: dict, comm_dir: Path, asked: str | None, bandwidth: str) -> tuple:
    """(all_reduce model, broadcast model or None) once the comm run can model `asked`."""
    _check_comm(comm, comm_dir, asked, bandwidth)
    model = comm_model(comm, "all_reduce", bandwidth)
    bcast = comm_model(comm, "broadcast", bandwidth) if "broadcast" in comm["models"] else None
    return model, bcast


def _assumptions(run: ProjectionInputs, comm: dict, ranks: list[int], kw: dict,
                 bandwidth: str) -> list[str]:  # fmt: skip
    """The projection's assumptions in words (analysis.project.model.assumptions)."""
    host = _host_words(comm, ranks, kw["gpn"], run)
    idle = "idle_penalty" in kw["comm_model"]
    return assumptions(kw["scaling"], run, kw["gpn"], kw["inter_gbps"], kw["batch_runs"],
                       bandwidth, idle=idle, host=host)  # fmt: skip


def _workload_runs(run: ProjectionInputs, paths: list[Path], traces: bool) -> list:
    """`--workload-runs`: the seed runs (RUN's mode and world size); a 1-rank DDP run of a
    single-device RUN becomes `run.ddp1`. One line for a run of another workload or kind."""
    seeds = []
    for path in paths:
        other = load_training(path, traces=traces)
        diff = [k for k in ("model", "dataset", "per_device_batch", "scaling")
                if getattr(other, k) != getattr(run, k)]  # fmt: skip
        same = other.mode == run.mode and other.world_size == run.world_size
        ddp1 = run.mode == "single" and other.mode == "ddp" and other.world_size == 1
        if diff or not (same or ddp1) or (ddp1 and run.ddp1 is not None):
            why = f"differs from RUN in {', '.join(diff)}" if diff else "is not a seed run of RUN"
            raise InputError(
                "--workload-runs",
                f"{path} {why}" + (" (a second 1-rank DDP run)" if ddp1 and not diff else ""),
                "pass runs of RUN's workload: same mode and world size, or one 1-rank DDP run",
            )
        if same:
            seeds.append(other)
        else:
            run.ddp1 = other
    return seeds


def _band_ends(run: ProjectionInputs, comm: dict, kw: dict, bandwidth: str,
               seeds: list[ProjectionInputs]) -> dict:  # fmt: skip
    """The knobs of predict_step at the band's low and high end, and their sources in words
    (analysis.project.bands)."""
    lo_c, hi_c, c_words = compute_spread(run, seeds)
    lo_m, hi_m, m_words = comm_models(comm, "all_reduce", bandwidth, kw["comm_model"])
    lo_b, hi_b = kw["bcast"], kw["bcast"]
    if kw["bcast"] is not None:
        lo_b, hi_b, _ = comm_models(comm, "broadcast", bandwidth, kw["bcast"])
    idle = "idle_penalty" in kw["comm_model"]
    words = {
        "compute": c_words,
        "comm": m_words + ("; idle penalty from 0 (hidden by rank skew) to the sweep's" if idle
                           else ""),
        "contention": "the comm run's host-contention range over its rounds (min–max)",
    }  # fmt: skip
    low = {"knobs": Knobs(lo_c, "slowdown_min", 0.0), "comm_model": lo_m, "bcast": lo_b}
    high = {
        "knobs": Knobs(hi_c, "slowdown_max", 1.0, skew_hides=False),
        "comm_model": hi_m,
        "bcast": hi_b,
    }
    return {"low": low, "high": high, "words": words}


def _check_finite(out: dict, run_dir: Path) -> None:
    """One line unless every predicted and checked number is finite (a degenerate input, e.g. a
    comm run or step times that give a zero or infinite step, cannot be projected)."""
    rows = [*out["predictions"], out["replay"], *out["measured"]]
    if out["replay_traced"]:
        rows.append(out["replay_traced"])
    for row in rows:
        bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad or not all(r["step_time_s"] > 0 for r in out["predictions"]):
            raise InputError(
                run_dir,
                f"cannot project: its inputs give a non-finite or zero {', '.join(bad) or 'step'}"
                f" at n={row['ranks']}",
                "check the run's steps.csv and the comm run's times",
            )


def _check_args(ranks: list[int], gpus_per_node: int, inter_node: str) -> float:
    """One line (InputError) for a bad argument; the inter-node link in Gb/s."""
    if not ranks or any(n < 1 for n in ranks):
        raise InputError("--ranks", f"got {ranks}", "every world size must be >= 1")
    if gpus_per_node < 1:
        raise InputError("--gpus-per-node", f"got {gpus_per_node}", "pass a count >= 1")
    return parse_inter_node(inter_node)


def _predictions(
    run: ProjectionInputs, ranks: list[int], kw: dict, ends: dict
) -> tuple[dict, list[dict]]:
    """The one-rank projection (the speedup's base) and the projection at each n in `ranks`,
    each with its band (analysis.project.bands.band_fields)."""
    base = predict_step(run, 1, **kw)
    preds = []
    for n in ranks:
        p = predict_step(run, n, **kw)
        p["speedup"] = p["samples_per_s"] / base["samples_per_s"]
        p["scaling_efficiency"] = p["speedup"] / n
        p.update(band_fields(run, n, kw, ends))
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
        "compute_s": run.compute_s,
        "traced_exposed_comm_s": run.traced_exposed_comm_s,
        "traced_exposed_share": run.exposed_share,
        "ddp1_run_id": run.ddp1.run_id if run.ddp1 is not None else None,
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
