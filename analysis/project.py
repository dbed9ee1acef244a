"""Scaling projection: what a measured training run would do at n ranks (`analysis project`).

Model (docs/analysis.md, "Scaling projection"), per projected world size n:
- compute: data, forward, backward and optimizer seconds per step from RUN's unprofiled,
  non-warm-up steps (steps.csv), plus the loop's remainder. Strong scaling gives each rank
  global ÷ n samples; data, forward and backward scale linearly with the per-device batch (an
  assumption, unless a measured run at that batch is given), optimizer and the remainder do not.
  Weak scaling keeps the per-device batch. For a DDP RUN, backward compute = its backward time
  minus the exposed communication its traces measured.
- communication: DDP's gradient buckets (run.json metrics.ddp, or computed from
  metrics.param_grad_bytes the way DDP's reducer assigns buckets), each all-reduced with the α–β
  model of a comm run (analysis.comm), hierarchical past one node: ring all-reduce inside the node
  plus ring all-reduce between nodes over the inter-node link (bytes per node ÷ link bandwidth).
  Buckets run one after another on one stream; bucket k may start once backward has produced its
  gradients (at backward × its cumulative share of gradient bytes) and bucket k−1 is done.
- straggler wait: the step waits for the slowest of n ranks, E[max of n independent draws] of
  RUN's per-step compute minus the same at RUN's own n (zero for the replay).
- step = compute + straggler wait + exposed communication (still running when backward ends).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.comm import is_comm_run, load_comm_run, with_measured_curve
from analysis.errors import AnalysisError
from analysis.project_model import (
    INTER_NODE_ALPHA_US,
    allreduce_us,
    assumptions,
    ddp_buckets,
    expected_max,
    parse_inter_node,
    simulate_step,
)

__all__ = ["load_training", "project", "straggler_s", "unprofiled_steps"]

PHASES = ("data", "forward", "backward", "optimizer")


def _profiled_from_schedule(steps: pd.Series, profile: dict) -> pd.Series:
    """Steps the profiler was on for (its warm-up and active steps), from config.profile."""
    if not profile or not profile.get("enabled", True):
        return pd.Series(False, index=steps.index)
    wait, warm, active = (int(profile.get(k, 0)) for k in ("wait", "warmup", "active"))
    cycle = max(1, wait + warm + active)
    repeat = int(profile.get("repeat", 0))
    in_cycles = (steps // cycle < repeat) if repeat > 0 else pd.Series(True, index=steps.index)
    return in_cycles & (steps % cycle >= wait)


def unprofiled_steps(steps: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Non-warm-up steps the profiler did not record: steps.csv `profiled` when present, else
    derived from config.profile's schedule (wait, warmup, active, repeat)."""
    if "profiled" in steps.columns:
        profiled = steps["profiled"].fillna(0).astype(int) == 1
    else:
        profiled = _profiled_from_schedule(steps["step"], config.get("profile") or {})
    return steps[(steps["warmup"] == 0) & ~profiled]


def load_training(run_dir: Path, *, traces: bool = True, trace: dict | None = None) -> dict:
    """A training run's projection inputs; AnalysisError (one line) when it cannot be projected.

    A DDP run's traces are analysed for its exposed communication (`traces=False`: not read;
    `trace`: an already computed traces JSON of this run)."""
    run_dir = Path(run_dir)
    run_json = run_dir / "run.json"
    if is_comm_run(run_dir):
        raise AnalysisError(run_dir, "is a comm benchmark, not a training run", "pass it as --comm")
    try:
        rec = json.loads(run_json.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise AnalysisError(
            run_json, "missing or unreadable", "pass a training run folder"
        ) from None
    config = rec.get("config") if isinstance(rec, dict) else None
    if not isinstance(config, dict) or config.get("mode") not in ("single", "ddp"):
        raise AnalysisError(
            run_dir, "is not a single-device or DDP training run", "pass one made by make profile-*"
        )
    if rec.get("status") != "ok":
        raise AnalysisError(run_dir, f"status is {rec.get('status')!r}", "pass a finished (ok) run")
    try:
        steps = pd.read_csv(run_dir / "steps.csv")
        body = unprofiled_steps(steps, config)
    except (OSError, ValueError, KeyError, pd.errors.ParserError) as err:
        raise AnalysisError(run_dir / "steps.csv", f"unreadable ({err})", "re-run it") from None
    if body.empty:
        raise AnalysisError(
            run_dir / "steps.csv",
            "has no unprofiled measured step (every non-warm-up step was profiled)",
            "re-run with more --max-steps than warm-up + profiled steps, or --no-profile",
        )
    phases = {p: float(body[f"{p}_s"].mean()) for p in PHASES}
    step = float(body["step_time_s"].mean())
    metrics = rec.get("metrics") or {}
    warnings: list[str] = []
    run = {
        "run_id": rec.get("run_id", run_dir.name),
        "path": str(run_dir),
        "mode": config["mode"],
        "backend": config.get("backend"),
        "world_size": int(config.get("world_size") or 1),
        "model": config.get("model"),
        "dataset": config.get("dataset"),
        "scaling": config.get("scaling", "strong"),
        "per_device_batch": int(config.get("per_device_batch") or 1),
        "global_batch": int(config.get("global_batch") or 1),
        "comm_hook": (config.get("ddp") or {}).get("comm_hook", "none"),
        "threads_per_rank": (rec.get("env") or {}).get("threads_per_rank"),
        "steps_used": int(body["step"].nunique()),
        "step_time_s": step,
        "phases_s": phases,
        "other_s": max(0.0, step - sum(phases.values())),
        "step_samples_s": body["step_time_s"].to_numpy(dtype=float),
        "backward_compute_s": phases["backward"],
        "traced_exposed_comm_s": None,
        "warnings": warnings,
    }
    ddp = metrics.get("ddp") or {}
    if ddp.get("bucket_sizes_bytes"):
        run["buckets_bytes"], run["bucket_source"] = list(ddp["bucket_sizes_bytes"]), "metrics.ddp"
    elif metrics.get("param_grad_bytes"):
        cap = float((config.get("ddp") or {}).get("bucket_cap_mb", 25.0))
        run["buckets_bytes"] = ddp_buckets(metrics["param_grad_bytes"], cap)
        run["bucket_source"] = f"computed from metrics.param_grad_bytes, bucket_cap_mb {cap:g}"
    else:
        raise AnalysisError(
            run_json,
            "has neither metrics.ddp bucket sizes nor metrics.param_grad_bytes",
            "re-run it with the current trainer",
        )
    if run["mode"] == "ddp" and run["world_size"] > 1:
        if traces:
            _subtract_traced_comm(run, run_dir, trace)
        else:
            warnings.append("traces not read: backward taken as all compute (incl. its comm wait)")
    run["compute_s"] = step - phases["backward"] + run["backward_compute_s"]
    return run


def _subtract_traced_comm(run: dict, run_dir: Path, trace: dict | None) -> None:
    """A DDP run's backward includes waiting for its all-reduces; take out the exposed part the
    traces measured, so compute is compute (the replay then re-adds the *modelled* exposure)."""
    from analysis.traces import analyze_trace_dir

    try:
        trace = trace or analyze_trace_dir(run_dir / "traces", progress=False)
    except AnalysisError as err:
        run["warnings"].append(f"{err} — backward taken as all compute")
        return
    # Profiled steps run slower than the unprofiled ones used here, so the traced exposed comm is
    # taken as a share of the traced step and scaled to the measured step (as the report does).
    shares = [
        r["exposed_comm_us"] / r["step_time_us_mean"]
        for r in trace["ranks"]
        if r.get("exposed_comm_us") is not None and r.get("step_time_us_mean")
    ]
    if not shares:
        run["warnings"].append("traces have no comm — backward taken as all compute")
        return
    run["traced_exposed_comm_s"] = float(np.mean(shares)) * run["step_time_s"]
    run["step_samples_s"] = run["step_samples_s"] * (1 - float(np.mean(shares)))
    bwd = run["phases_s"]["backward"]
    run["backward_compute_s"] = max(0.1 * bwd, bwd - run["traced_exposed_comm_s"])
    if run["backward_compute_s"] == 0.1 * bwd:
        run["warnings"].append(
            "traced exposed comm exceeds 90% of backward: backward compute floored at 10%"
        )


def straggler_s(run: dict, n: int) -> float:
    """Extra step time from waiting for the slowest of n ranks: E[max of n] − E[max of RUN's n]
    of RUN's per-step compute (a DDP run's samples already carry its own ranks' max)."""
    x = run["step_samples_s"]
    if x.size == 0 or n <= run["world_size"]:
        return 0.0
    return max(0.0, expected_max(x, n) - expected_max(x, run["world_size"]))


def _compute(run: dict, batch: float, batch_runs: dict[int, dict]) -> tuple[dict, str]:
    """Per-step compute phases at per-device `batch`: a measured run at that batch, else linear."""
    other = batch_runs.get(int(batch)) if float(batch).is_integer() else None
    if other is not None and int(batch) != run["per_device_batch"]:
        ph = dict(other["phases_s"], backward=other["backward_compute_s"], other=other["other_s"])
        return ph, f"measured ({other['run_id']})"
    k = batch / run["per_device_batch"]
    ph = {
        "data": run["phases_s"]["data"] * k,
        "forward": run["phases_s"]["forward"] * k,
        "backward": run["backward_compute_s"] * k,
        "optimizer": run["phases_s"]["optimizer"],
        "other": run["other_s"],
    }
    return ph, "measured" if k == 1 else "linear in batch"


def _predict(run, n, *, scaling, comm_model, gpn, inter_gbps, batch_runs, wire) -> dict:
    batch = run["global_batch"] / n if scaling == "strong" else run["per_device_batch"]
    ph, source = _compute(run, batch, batch_runs)
    compute = sum(ph.values())
    sizes = [b * wire for b in run["buckets_bytes"]]
    total = sum(sizes)
    ready = list(np.cumsum(sizes) / total * ph["backward"]) if total else []
    comm = [allreduce_us(b, n, gpn, comm_model, inter_gbps) / 1e6 for b in sizes]
    end = simulate_step(ready, comm, ph["backward"])
    exposed = max(0.0, end - ph["backward"]) if n > 1 else 0.0
    # the slowest rank's compute, scaled like the compute it stretches
    wait = straggler_s(run, n) * compute / run["compute_s"] if n > 1 else 0.0
    step = compute + wait + exposed
    global_batch = batch * n
    return {
        "ranks": n,
        "per_device_batch": batch,
        "global_batch": global_batch,
        "compute_source": source,
        "step_time_s": step,
        "compute_s": compute,
        "comm_s": float(sum(comm)) if n > 1 else 0.0,
        "exposed_comm_s": exposed,
        "straggler_s": wait,
        "exposed_comm_pct": 100 * exposed / step if step else 0.0,
        "samples_per_s": global_batch / step,
    }


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
    (analysis.comm.with_measured_curve); `fit` = the single fitted (α, B) pair."""
    if not ranks or any(n < 1 for n in ranks):
        raise AnalysisError("--ranks", f"got {ranks}", "every world size must be >= 1")
    if gpus_per_node < 1:
        raise AnalysisError("--gpus-per-node", f"got {gpus_per_node}", "pass a count >= 1")
    inter_gbps = parse_inter_node(inter_node)
    run = load_training(run_dir, traces=traces, trace=trace)
    comm = load_comm_run(comm_dir)
    asked = backend or (run["backend"] if run["mode"] == "ddp" else comm["backend"])
    if comm["backend"] != asked:
        raise AnalysisError(
            comm_dir,
            f"benchmarks {comm['backend']}, not the {asked} asked for",
            f"pass a comm run made with BACKEND={asked}",
        )
    if comm["status"] != "ok" or int(comm["world_size"] or 0) < 2:
        raise AnalysisError(
            comm_dir,
            f"is not a finished benchmark over >= 2 ranks (status {comm['status']}, "
            f"{comm['world_size']} rank(s): nothing was transferred)",
            "run make bench-comm with NPROC >= 2",
        )
    if "all_reduce" not in comm["models"]:
        raise AnalysisError(comm_dir, "has no all_reduce fit", "re-run make bench-comm")
    model = comm["models"]["all_reduce"]
    if bandwidth == "measured":
        rows = pd.DataFrame(comm["rows"])
        rows = rows[rows["collective"] == "all_reduce"]
        model = with_measured_curve(model, rows["bytes"], rows["time_us_median"])
    elif bandwidth != "fit":
        raise AnalysisError("--bandwidth", f"got {bandwidth!r}", "use measured or fit")
    scaling = scaling or run["scaling"]
    wire = wire_bytes_factor or (0.5 if run["comm_hook"] in ("fp16", "bf16") else 1.0)
    warnings = list(run["warnings"])
    big = [b for b in run["buckets_bytes"] if b * wire > model["bytes_max"]]
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
    by_batch = {}
    for d in batch_runs:
        other = load_training(d, traces=traces)
        by_batch[other["per_device_batch"]] = other
    kw = dict(
        scaling=scaling,
        comm_model=model,
        gpn=gpus_per_node,
        inter_gbps=inter_gbps,
        batch_runs=by_batch,
        wire=wire,
    )
    base = _predict(run, 1, **kw)
    preds = []
    for n in ranks:
        p = _predict(run, n, **kw)
        p["speedup"] = p["samples_per_s"] / base["samples_per_s"]
        p["scaling_efficiency"] = p["speedup"] / n
        preds.append(p)
    replay = _check(run, run, kw, base)
    checks = [_check(run, load_training(d, traces=False), kw, base) for d in measured]
    return {
        "schema_version": 1,
        "run_id": run["run_id"],
        "run_path": run["path"],
        "comm_run_id": comm["run_id"],
        "backend": asked,
        "scaling": scaling,
        "ranks": list(ranks),
        "inputs": {
            "mode": run["mode"],
            "world_size": run["world_size"],
            "model": run["model"],
            "dataset": run["dataset"],
            "per_device_batch": run["per_device_batch"],
            "global_batch": run["global_batch"],
            "threads_per_rank": run["threads_per_rank"],
            "steps_used": run["steps_used"],
            "measured_step_time_s": run["step_time_s"],
            "phases_s": run["phases_s"],
            "other_s": run["other_s"],
            "backward_compute_s": run["backward_compute_s"],
            "traced_exposed_comm_s": run["traced_exposed_comm_s"],
            "buckets_bytes": run["buckets_bytes"],
            "bucket_source": run["bucket_source"],
            "comm_hook": run["comm_hook"],
            "wire_bytes_factor": wire,
            "all_reduce_model": model,
            "bandwidth_source": bandwidth,
            "gpus_per_node": gpus_per_node,
            "inter_node_gbps": inter_gbps,
            "inter_node_alpha_us": INTER_NODE_ALPHA_US,
        },
        "assumptions": assumptions(scaling, run, gpus_per_node, inter_gbps, by_batch, bandwidth),
        "replay": replay,
        "measured": checks,
        "predictions": preds,
        "warnings": warnings,
    }


def _check(run: dict, target: dict, kw: dict, base: dict) -> dict:
    """Projection of `run` at `target`'s world size vs `target`'s measured unprofiled step time;
    `measured_scaling_efficiency` divides by the same projected n = 1 throughput as predictions."""
    n = target["world_size"]
    measured_sps = target["global_batch"] / target["step_time_s"]
    p = _predict(run, n, **kw)
    err = 100 * (p["step_time_s"] - target["step_time_s"]) / target["step_time_s"]
    note = None
    if target is run and n == 1:
        note = (
            "single-device run: no communication to model, so the replay is exact by construction"
        )
    if abs(p["per_device_batch"] - target["per_device_batch"]) > 1e-9:
        note = (
            f"per-device batch differs ({p['per_device_batch']:g} vs {target['per_device_batch']})"
        )
    return {
        "run_id": target["run_id"],
        "ranks": n,
        "measured_step_time_s": target["step_time_s"],
        "predicted_step_time_s": p["step_time_s"],
        "error_pct": err,
        "measured_samples_per_s": measured_sps,
        "measured_scaling_efficiency": measured_sps / base["samples_per_s"] / n,
        "note": note,
    }
