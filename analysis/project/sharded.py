"""`analysis project` for the sharded members of the family: a ZeRO-1 or FSDP2 run projected to
more ranks from a comm benchmark, all_gather and reduce_scatter timed like all_reduce (their α–β
fits and measured curves), with the replay error at the run's own world size
(analysis.project.sharded_step has the model; definitions: docs/reference/metrics.md §10).

Its inputs (measured phases less each rank's exposed communication, FSDP2's groups, ZeRO-1's
buckets and parameters, the algorithm each collective ran as) are read by
analysis.project.sharded_inputs.

Every prediction carries a band (analysis.project.bands' definitions): the same projection
with the run's per-step compute (pooled with `workload_runs` of its mode and world size), every
collective's times per message size and the host contention at their low and at their high end.

`project_any` is the one entry of `analysis project` and the report: a ZeRO-1 or FSDP2 run goes
here, any other to analysis.project.projection.project.
"""

from __future__ import annotations

from pathlib import Path

from analysis.project.bands import band_ends, comm_model, comm_models, compute_spread
from analysis.project.checks import check_entry
from analysis.project.comm import load_comm_run
from analysis.project.model import INTER_NODE_ALPHA_US, parse_inter_node
from analysis.project.projection import project
from analysis.project.sharded_inputs import ShardedInputs, algorithm, is_sharded, load_sharded
from analysis.project.sharded_step import call_time, fsdp_step, zero_step
from analysis.project.step import Knobs, contention_ratio
from profiler.runfolder.errors import InputError
from profiler.runfolder.versions import PROJECTION_JSON_SCHEMA_VERSION

__all__ = ["BENCH_NAMES", "collective_models", "project_any", "project_sharded"]

# The comm benchmark's name of each collective (workloads/comm/ops.py).
BENCH_NAMES = {
    "all_gather": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter_tensor",
    "all_reduce": "all_reduce",
    "broadcast": "broadcast",
}


def collective_models(
    inp: ShardedInputs, comm: dict, comm_dir: Path, bandwidth: str
) -> dict[str, dict]:
    """The comm run's model of the algorithm behind each collective the run makes; one line
    naming the collective and the backend when the comm run has none."""
    needed = ["broadcast"] if inp.strategy == "zero1" else ["all_gather", "reduce_scatter"]
    out = {}
    for collective in needed:
        bench = BENCH_NAMES.get(algorithm(inp, collective), algorithm(inp, collective))
        if bench not in comm["models"]:
            why = next((s.get("reason") for s in comm["skipped"] if isinstance(s, dict)
                        and s.get("collective") == bench), None)  # fmt: skip
            raise InputError(
                comm_dir,
                f"has no {bench} fit, the collective a {inp.strategy} run's {collective} runs as"
                f" on {comm['backend']}" + (f" ({comm['backend']} lacks it: {why})" if why else ""),
                f"re-run make bench-comm with {bench} among COMM_COLLECTIVES on a backend that has it",
            )
        out[collective] = comm_model(comm, bench, bandwidth)
    return out


def _ends(inp: ShardedInputs, comm: dict, kw: dict, seeds: list[ShardedInputs]) -> dict:
    """The band's two ends (analysis.project.bands): compute scale, contention and every comm
    model at their low and high end, and their sources in words."""
    lo_c, hi_c, c_words = compute_spread(inp, seeds)  # type: ignore[arg-type]
    low: dict = {"scale": lo_c, "contention": "slowdown_min", "models": {}}
    high: dict = {"scale": hi_c, "contention": "slowdown_max", "models": {}}
    words = []
    for collective, point in kw["models"].items():
        bench = BENCH_NAMES.get(algorithm(inp, collective), algorithm(inp, collective))
        low["models"][collective], high["models"][collective], w = comm_models(
            comm, bench, kw["bandwidth"], point
        )
        words.append(w)
    low["all_reduce"] = high["all_reduce"] = kw["all_reduce"]
    if kw["all_reduce"] is not None:
        low["all_reduce"], high["all_reduce"], w = comm_models(
            comm, "all_reduce", kw["bandwidth"], kw["all_reduce"]
        )
        words.append(w)
    return {"low": low, "high": high, "words": {"compute": c_words, "comm": "; ".join(words)}}


def _predict(inp: ShardedInputs, n: int, kw: dict) -> dict:
    """The prediction at n with `kw`'s inputs (the point estimate, or a band end's)."""
    batch = inp.global_batch / n if kw["scaling"] == "strong" else inp.per_device_batch
    call = call_time(kw["models"], n, kw["gpn"], kw["inter_gbps"])
    scale, which = kw.get("scale", 1.0), kw.get("contention", "slowdown")
    if inp.strategy == "zero1":
        ddp_kw = {k: kw[k] for k in ("scaling", "gpn", "inter_gbps", "host")}
        ddp_kw.update(comm_model=kw["all_reduce"], batch_runs={}, wire=1.0,
                      bcast=kw["models"]["broadcast"], knobs=Knobs(scale, which))  # fmt: skip
        return zero_step(inp, n, batch, ddp_kw, call)
    ratio = contention_ratio(inp, n, kw["gpn"], kw["host"], which)  # type: ignore[arg-type]
    return fsdp_step(inp, n, batch, ratio * scale, call)


def _band(inp: ShardedInputs, n: int, kw: dict, ends: dict) -> dict:
    """The band fields of the prediction at n (analysis.project.bands.band_fields' keys)."""
    runs = [{}, ends["low"], ends["high"]]
    preds = [(_predict(inp, n, {**kw, **e}), _predict(inp, 1, {**kw, **e})) for e in runs]
    steps = [p["step_time_s"] for p, _ in preds]
    speedups = [p["samples_per_s"] / one["samples_per_s"] for p, one in preds]
    sources = [{"term": "compute", "low": ends["low"]["scale"], "high": ends["high"]["scale"],
                "unit": "×", "source": ends["words"]["compute"]}]  # fmt: skip
    if n > 1:
        comm = [p["exposed_comm_s"] for p, _ in preds]
        sources.append({"term": "exposed_comm_s", "low": min(comm), "high": max(comm),
                        "unit": "s", "source": ends["words"]["comm"]})  # fmt: skip
    return band_ends(steps, speedups, n, sources)


def _check(inp: ShardedInputs, target: ShardedInputs, kw: dict, base: dict, ends: dict) -> dict:
    """`inp` projected at `target`'s world size vs `target`'s measured step, with the band
    (analysis.project.checks.check's keys)."""
    n = target.world_size
    p = _predict(inp, n, kw)
    band = _band(inp, n, kw, ends)
    lo, hi = band["step_time_s_low"], band["step_time_s_high"]
    traced = sum(target.traced_exposed_s.values()) or None
    return check_entry(target.run_id, n, target.step_time_s, target.global_batch, p, (lo, hi),
                       traced, base)  # fmt: skip


def project_sharded(run_dir: Path, comm_dir: Path, ranks: list[int], *, gpus_per_node: int = 8,
                    inter_node: str = "100", scaling: str | None = None, backend: str | None = None,
                    measured: list[Path] = (), workload_runs: list[Path] = (),
                    traces: bool | dict = True, bandwidth: str = "measured") -> dict:  # fmt: skip
    """The projection JSON of a ZeRO-1 or FSDP2 run (keys as analysis.project.projection's);
    `traces` as there: read them, not, or an already computed traces JSON of the run."""
    if not ranks or any(n < 1 for n in ranks) or gpus_per_node < 1:
        raise InputError(
            "--ranks/--gpus-per-node", f"got {ranks}, {gpus_per_node}", "use counts >= 1"
        )
    given = traces if isinstance(traces, dict) else None
    inp = load_sharded(run_dir, traces=bool(traces), trace=given)
    comm = load_comm_run(comm_dir)
    asked = backend or inp.backend
    if comm["backend"] != asked or comm["status"] != "ok" or int(comm["world_size"] or 0) < 2:
        raise InputError(comm_dir, f"is not a finished {asked} benchmark over >= 2 ranks",
                         f"pass a comm run made with BACKEND={asked} and NPROC >= 2")  # fmt: skip
    kw = {"scaling": scaling or inp.scaling, "gpn": gpus_per_node, "host": comm["host_contention"],
          "inter_gbps": parse_inter_node(inter_node), "bandwidth": bandwidth,
          "models": collective_models(inp, comm, comm_dir, bandwidth)}  # fmt: skip
    kw["all_reduce"] = (
        comm_model(comm, "all_reduce", bandwidth) if inp.strategy == "zero1" else None
    )
    ends = _ends(inp, comm, kw, [_seed(inp, d) for d in workload_runs])
    base = _predict(inp, 1, kw)
    preds = []
    for n in ranks:
        p = _predict(inp, n, kw)
        p["speedup"] = p["samples_per_s"] / base["samples_per_s"]
        p["scaling_efficiency"] = p["speedup"] / n
        preds.append({**p, **_band(inp, n, kw, ends)})
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
        "replay": _check(inp, inp, kw, base, ends),
        "replay_traced": None,  # no per-call self-replay for the sharded modes
        "measured": [_check(inp, load_sharded(d, traces=False), kw, base, ends) for d in measured],
        "predictions": preds,
        "warnings": list(inp.warnings) + (inp.ddp.warnings if inp.ddp else []),
    }


def _seed(inp: ShardedInputs, path: Path) -> ShardedInputs:
    """A `--workload-runs` run: another seed of RUN (its strategy and world size); one line
    otherwise."""
    other = load_sharded(path, traces=False)
    same = (other.strategy, other.world_size, other.per_device_batch) == (
        inp.strategy, inp.world_size, inp.per_device_batch)  # fmt: skip
    if not same:
        raise InputError("--workload-runs", f"{path} is not a seed run of RUN",
                         "pass runs of RUN's mode, world size and per-device batch")  # fmt: skip
    return other


def _inputs_json(inp: ShardedInputs, kw: dict, bandwidth: str) -> dict:
    """The projection JSON's `inputs` (DDP's keys where they apply, the sharded ones besides)."""
    models = ({"all_reduce": kw["all_reduce"]} if kw["all_reduce"] else {}) | kw["models"]
    return {
        "mode": inp.strategy, "world_size": inp.world_size, "per_device_batch": inp.per_device_batch,
        "global_batch": inp.global_batch, "measured_step_time_s": inp.step_time_s,
        "phases_s": inp.phases_s, "compute_phases_s": inp.compute_phases_s,
        "traced_exposed_comm_s": inp.traced_exposed_s, "fsdp_groups": inp.groups,
        "reshard_after_forward": inp.reshard_after_forward,
        "algorithms": {c: algorithm(inp, c) for c in models},
        "comm_models": models, "all_reduce_model": kw["all_reduce"] or kw["models"]["reduce_scatter"],
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
        + ", ".join(f"({c} as {algorithm(inp, c)})" for c in kw["models"]),
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
