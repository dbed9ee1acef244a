"""`analysis project` for the sharded members of the family: a ZeRO-1 or FSDP2 run projected to
more ranks from a comm benchmark, all_gather and reduce_scatter timed like all_reduce (their α–β
fits and measured curves), with the replay error at the run's own world size
(analysis.project.sharded_step has the model; definitions: docs/reference/metrics.md §10).

Inputs read from the run folder: the measured (unprofiled) step phases (steps.csv); the
communication each rank's trace measured exposed in each phase (`exposed_comm_us_by_phase`, as a
share of its traced step applied to its measured step), taken out of that phase so compute is
compute, the slowest rank's compute kept;
FSDP2's groups (metrics.fsdp: unsharded bytes and elements of each fully_shard call) and
reshard_after_forward; ZeRO-1's DDP buckets and parameter sizes (metrics.ddp,
metrics.param_grad_bytes; each parameter is broadcast by its owner); and the algorithm each
collective ran as (analysis.trace.c10d: gloo's reduce-scatter is an all-reduce).

`project_any` is the one entry of `analysis project` and the report: a ZeRO-1 or FSDP2 run goes
here, any other to analysis.project.projection.project.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analysis.project.comm import load_comm_run
from analysis.project.inputs import load_training, measured_steps
from analysis.project.model import INTER_NODE_ALPHA_US, ProjectionInputs, parse_inter_node
from analysis.project.projection import _comm_model, project
from analysis.project.sharded_step import call_time, fsdp_step, zero_step
from analysis.project.step import contention_ratio
from analysis.trace.folder import analyze_trace_dir
from profiler.runfolder.errors import InputError, safe_text
from profiler.runfolder.layout import RUN_JSON, STEP_PHASES, STEPS_CSV
from profiler.runfolder.records import read_record
from profiler.runfolder.steps import read_steps_frame
from profiler.runfolder.versions import PROJECTION_JSON_SCHEMA_VERSION

__all__ = ["ShardedInputs", "is_sharded", "load_sharded", "project_any", "project_sharded"]

# The comm benchmark's name of each collective (workloads/comm/ops.py).
BENCH_NAMES = {
    "all_gather": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter_tensor",
    "all_reduce": "all_reduce",
    "broadcast": "broadcast",
}


@dataclass(kw_only=True)
class ShardedInputs:
    """A ZeRO-1 or FSDP2 run as the projection reads it; seconds per step."""

    run_id: str
    path: str
    strategy: str
    """zero1 | fsdp | fsdp_keep."""
    backend: str | None
    device_type: str
    world_size: int
    scaling: str
    per_device_batch: int
    global_batch: int
    step_time_s: float
    phases_s: dict[str, float]
    compute_phases_s: dict[str, float]
    """phases_s less the exposed communication traced in each."""
    other_s: float
    step_samples_s: np.ndarray
    compute_s: float
    groups: list[dict] = field(default_factory=list)
    reshard_after_forward: bool = True
    param_bytes: list[int] = field(default_factory=list)
    algorithms: dict[str, str] = field(default_factory=dict)
    """collective -> what the backend ran it as (a key of BENCH_NAMES)."""
    traced_exposed_s: dict[str, float] = field(default_factory=dict)
    ddp: ProjectionInputs | None = None
    warnings: list[str] = field(default_factory=list)


def is_sharded(run_dir: Path) -> bool:
    """A finished-or-not ZeRO-1 or FSDP2 training run (False for anything unreadable)."""
    try:
        rec, _ = read_record(Path(run_dir) / RUN_JSON)
    except InputError:
        return False
    return rec.config.mode == "fsdp" or bool(rec.config.mode == "ddp" and rec.config.zero)


def _algorithms(trace: dict) -> dict[str, str]:
    """What each collective ran as (analysis.trace.c10d), from a traces JSON."""
    return {
        c["name"].split(":", 1)[-1]: str(c.get("algorithm") or c["name"]).split(":", 1)[-1]
        for c in trace.get("collectives") or []
    }


def _trace_of(run_dir: Path, trace: dict | None, traces: bool, warnings: list[str]) -> dict:
    if trace is not None or not traces:
        if not traces:
            warnings.append("traces not read: every phase taken as all compute (incl. comm waits)")
        return trace or {}
    try:
        return analyze_trace_dir(run_dir / "traces", progress=False)
    except InputError as err:
        warnings.append(f"{err} — every phase taken as all compute")
        return {}


def _compute_phases(body, trace: dict, warnings: list[str]) -> tuple[dict, dict]:  # noqa: ANN001
    """Per phase: the slowest rank's compute, i.e. its measured phase less the communication its
    own trace measured exposed in that phase (as a share of its traced step, applied to its
    measured step; floored at 10% of the phase), and the exposed seconds (mean over ranks). The
    slowest rank, not the mean: a rank that waits for a fuller one (ZeRO-1's partition) has the
    fuller rank's compute on its critical path."""
    traced = {r["rank"]: r for r in trace.get("ranks") or [] if r.get("step_time_us_mean")}
    per_rank = body.groupby("rank")[[f"{p}_s" for p in STEP_PHASES] + ["step_time_s"]].mean()
    compute: dict[str, list[float]] = {p: [] for p in STEP_PHASES}
    exposed: dict[str, list[float]] = {p: [] for p in STEP_PHASES}
    for rank, row in per_rank.iterrows():
        by_phase = (traced.get(int(rank)) or {}).get("exposed_comm_us_by_phase") or {}
        step_us = (traced.get(int(rank)) or {}).get("step_time_us_mean") or 1.0
        for p in STEP_PHASES:
            phase, out = float(row[f"{p}_s"]), by_phase.get(p, 0.0) / step_us * row["step_time_s"]
            compute[p].append(max(0.1 * phase, phase - out))
            exposed[p].append(min(out, 0.9 * phase))
    if trace and not any(r.get("exposed_comm_us_by_phase") for r in traced.values()):
        warnings.append("the traces have no collectives by phase: every phase taken as compute")
    return ({p: max(v) if p != "data" else statistics.fmean(v) for p, v in compute.items()},
            {p: statistics.fmean(v) for p, v in exposed.items() if any(v)})  # fmt: skip


def load_sharded(run_dir: Path, *, traces: bool = True, trace: dict | None = None) -> ShardedInputs:
    """A ZeRO-1 or FSDP2 run's projection inputs (the module docstring); one line otherwise."""
    run_dir = Path(run_dir)
    rec, _ = read_record(run_dir / RUN_JSON)
    cfg, metrics = rec.config, rec.metrics
    if not is_sharded(run_dir) or rec.status != "ok":
        raise InputError(run_dir, "is not a finished ZeRO-1 or FSDP2 run", "pass one that is")
    steps = read_steps_frame(run_dir / STEPS_CSV, world_size=cfg.world_size)
    body, fallback = measured_steps(steps, cfg)
    if body.empty:
        raise InputError(run_dir / STEPS_CSV, "has no measured step", "raise --max-steps")
    warnings = [fallback] if fallback else []
    phases = {p: float(body[f"{p}_s"].mean()) for p in STEP_PHASES}
    step = float(body["step_time_s"].mean())
    trace = _trace_of(run_dir, trace, traces, warnings)
    compute, exposed = _compute_phases(body, trace, warnings)
    exposed_share = min(sum(exposed.values()) / step, 0.9)
    inp = ShardedInputs(
        run_id=safe_text(rec.run_id or run_dir.name),
        path=str(run_dir),
        strategy="zero1" if cfg.mode == "ddp" else (
            "fsdp_keep" if cfg.fsdp and cfg.fsdp.reshard_after_forward is False else "fsdp"),
        backend=cfg.backend,
        device_type=(cfg.devices or ["cpu"])[0].split(":")[0],
        world_size=int(cfg.world_size or 1),
        scaling=cfg.scaling or "strong",
        per_device_batch=int(cfg.per_device_batch or 1),
        global_batch=int(cfg.global_batch or 1),
        step_time_s=step,
        phases_s=phases,
        compute_phases_s=compute,
        other_s=max(0.0, step - sum(phases.values())),
        step_samples_s=body["step_time_s"].to_numpy(dtype=float) * (1 - exposed_share),
        compute_s=step - sum(phases.values()) + sum(compute.values()),
        groups=[{f: getattr(g, f) for f in g.__struct_fields__} for g in metrics.fsdp.groups]
        if metrics.fsdp
        else [],
        reshard_after_forward=not (cfg.fsdp and cfg.fsdp.reshard_after_forward is False),
        param_bytes=list(metrics.param_grad_bytes or []),
        algorithms=_algorithms(trace),
        traced_exposed_s=exposed,
        warnings=warnings,
    )  # fmt: skip
    if inp.strategy != "zero1" and not inp.groups:
        raise InputError(
            run_dir / RUN_JSON, "has no metrics.fsdp groups", "re-run it with this dpscope"
        )
    if inp.strategy == "zero1":
        inp.ddp = load_training(run_dir, traces=False)
        inp.ddp.warnings.clear()  # its "traces not read" note: the exposed share is taken here
        inp.ddp.backward_compute_s = compute["backward"]
        inp.ddp.compute_s = inp.compute_s
        inp.ddp.step_samples_s = inp.step_samples_s
    return inp


def _algorithm(inp: ShardedInputs, collective: str) -> str:
    """What `collective` runs as on the run's backend: from its traces, else gloo's rule."""
    if collective in inp.algorithms:
        return inp.algorithms[collective]
    return "all_reduce" if collective == "reduce_scatter" and inp.backend == "gloo" else collective


def _models(inp: ShardedInputs, comm: dict, comm_dir: Path, bandwidth: str) -> dict[str, dict]:
    """The comm run's model of the algorithm behind each collective the run makes; one line
    naming the collective and the backend when the comm run has none."""
    needed = ["broadcast"] if inp.strategy == "zero1" else ["all_gather", "reduce_scatter"]
    out = {}
    for collective in needed:
        bench = BENCH_NAMES.get(_algorithm(inp, collective), _algorithm(inp, collective))
        if bench not in comm["models"]:
            why = next((s.get("reason") for s in comm["skipped"] if isinstance(s, dict)
                        and s.get("collective") == bench), None)  # fmt: skip
            raise InputError(
                comm_dir,
                f"has no {bench} fit, the collective a {inp.strategy} run's {collective} runs as"
                f" on {comm['backend']}" + (f" ({comm['backend']} lacks it: {why})" if why else ""),
                f"re-run make bench-comm with {bench} among COMM_COLLECTIVES on a backend that has it",
            )
        out[collective] = _comm_model(comm, bench, bandwidth)
    return out


def _predict(inp: ShardedInputs, n: int, kw: dict) -> dict:
    batch = inp.global_batch / n if kw["scaling"] == "strong" else inp.per_device_batch
    call = call_time(kw["models"], n, kw["gpn"], kw["inter_gbps"])
    if inp.strategy == "zero1":
        ddp_kw = {k: kw[k] for k in ("scaling", "gpn", "inter_gbps", "host")}
        ddp_kw.update(
            comm_model=kw["all_reduce"], batch_runs={}, wire=1.0, bcast=kw["models"]["broadcast"]
        )
        return zero_step(inp, n, batch, ddp_kw, call)
    ratio = contention_ratio(inp, n, kw["gpn"], kw["host"])  # type: ignore[arg-type]
    return fsdp_step(inp, n, batch, ratio, call)


def _check(inp: ShardedInputs, target: ShardedInputs, kw: dict, base: dict) -> dict:
    """`inp` projected at `target`'s world size vs `target`'s measured step."""
    p = _predict(inp, target.world_size, kw)
    sps = target.global_batch / target.step_time_s
    return {
        "run_id": target.run_id,
        "ranks": target.world_size,
        "measured_step_time_s": target.step_time_s,
        "predicted_step_time_s": p["step_time_s"],
        "error_pct": 100 * (p["step_time_s"] - target.step_time_s) / target.step_time_s,
        "measured_samples_per_s": sps,
        "measured_scaling_efficiency": sps / base["samples_per_s"] / target.world_size,
        "note": None,
    }


def project_sharded(run_dir: Path, comm_dir: Path, ranks: list[int], *, gpus_per_node: int = 8,
                    inter_node: str = "100", scaling: str | None = None, backend: str | None = None,
                    measured: list[Path] = (), traces: bool = True, trace: dict | None = None,
                    bandwidth: str = "measured") -> dict:  # fmt: skip
    """The projection JSON of a ZeRO-1 or FSDP2 run (keys as analysis.project.projection's)."""
    if not ranks or any(n < 1 for n in ranks) or gpus_per_node < 1:
        raise InputError(
            "--ranks/--gpus-per-node", f"got {ranks}, {gpus_per_node}", "use counts >= 1"
        )
    inp = load_sharded(run_dir, traces=traces, trace=trace)
    comm = load_comm_run(comm_dir)
    asked = backend or inp.backend
    if comm["backend"] != asked or comm["status"] != "ok" or int(comm["world_size"] or 0) < 2:
        raise InputError(comm_dir, f"is not a finished {asked} benchmark over >= 2 ranks",
                         f"pass a comm run made with BACKEND={asked} and NPROC >= 2")  # fmt: skip
    kw = {"scaling": scaling or inp.scaling, "gpn": gpus_per_node, "host": comm["host_contention"],
          "inter_gbps": parse_inter_node(inter_node), "models": _models(inp, comm, comm_dir, bandwidth)}  # fmt: skip
    kw["all_reduce"] = (
        _comm_model(comm, "all_reduce", bandwidth) if inp.strategy == "zero1" else None
    )
    base = _predict(inp, 1, kw)
    preds = []
    for n in ranks:
        p = _predict(inp, n, kw)
        p["speedup"] = p["samples_per_s"] / base["samples_per_s"]
        p["scaling_efficiency"] = p["speedup"] / n
        preds.append(p)
    return {
        "schema_version": PROJECTION_JSON_SCHEMA_VERSION,
        "run_id": inp.run_id,
        "run_path": inp.path,
        "comm_run_id": comm["run_id"],
        "backend": asked,
        "scaling": kw["scaling"],
        "ranks": list(ranks),
        "inputs": _inputs_json(inp, kw, bandwidth),
        "assumptions": _assumptions(inp, kw),
        "replay": _check(inp, inp, kw, base),
        "measured": [_check(inp, load_sharded(d, traces=False), kw, base) for d in measured],
        "predictions": preds,
        "warnings": list(inp.warnings) + (inp.ddp.warnings if inp.ddp else []),
    }


def _inputs_json(inp: ShardedInputs, kw: dict, bandwidth: str) -> dict:
    """The projection JSON's `inputs` (DDP's keys where they apply, the sharded ones besides)."""
    return {
        "mode": inp.strategy, "world_size": inp.world_size, "per_device_batch": inp.per_device_batch,
        "global_batch": inp.global_batch, "measured_step_time_s": inp.step_time_s,
        "phases_s": inp.phases_s, "compute_phases_s": inp.compute_phases_s,
        "traced_exposed_comm_s": inp.traced_exposed_s, "fsdp_groups": inp.groups,
        "reshard_after_forward": inp.reshard_after_forward,
        "algorithms": {c: _algorithm(inp, c) for c in kw["models"]},
        "comm_models": kw["models"], "all_reduce_model": kw["all_reduce"] or kw["models"]["reduce_scatter"],
        "bandwidth_source": bandwidth, "gpus_per_node": kw["gpn"], "inter_node_gbps": kw["inter_gbps"],
        "inter_node_alpha_us": INTER_NODE_ALPHA_US, "wire_bytes_factor": 1.0,
    }  # fmt: skip


def _assumptions(inp: ShardedInputs, kw: dict) -> list[str]:
    common = [
        f"{kw['scaling']} scaling; data, forward and backward time linear in the per-device batch, "
        "the optimizer step in the rank's share of the parameters (run ranks ÷ n)",
        "the communication the traces measured exposed in each phase is taken out of that phase",
        f"ring α–β models of the comm run inside a node of {kw['gpn']} ranks, hierarchical beyond; "
        "each collective timed as the algorithm the backend runs it as "
        + ", ".join(f"({c} as {_algorithm(inp, c)})" for c in kw["models"]),
        "no idle penalty and no host contention beyond the comm run's; the step waits for the "
        "slowest rank (E[max of n draws] of the run's per-step compute)",
    ]
    if inp.strategy == "zero1":
        return common + ["DDP's buckets all-reduced under backward (as for DDP); then each "
                         "parameter broadcast once by its owner, nothing overlapping"]  # fmt: skip
    fwd = "prefetched one group ahead" if inp.device_type == "cuda" else "issued when needed (CPU)"
    again = "all-gathered again in backward" if inp.reshard_after_forward else "kept from forward"
    return common + [
        f"FSDP2: one collective stream; forward all-gathers {fwd}; non-root groups {again}, "
        "prefetched one group ahead; each group's reduce-scatter when its backward ends; compute "
        "of a group ∝ its parameters"
    ]


def project_any(run_dir: Path, comm_dir: Path, ranks: list[int], **kw) -> dict:  # noqa: ANN003
    """`analysis project`: a ZeRO-1 or FSDP2 run here, any other through projection.project
    (`batch_runs` and `wire_bytes_factor` only apply to those)."""
    if is_sharded(run_dir):
        for only in ("batch_runs", "wire_bytes_factor"):
            if kw.pop(only, None):
                raise InputError(f"--{only.replace('_', '-')}", "applies to single/DDP runs",
                                 "drop it for a ZeRO-1 or FSDP2 run")  # fmt: skip
        return project_sharded(run_dir, comm_dir, ranks, **kw)
    return project(run_dir, comm_dir, ranks, **kw)
