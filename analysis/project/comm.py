"""Collective benchmark results (`make bench-comm` run folders) and their latency–bandwidth model.

A comm run folder holds `run.json` with `kind: "comm"` and `comm.csv` (one row per collective and
message size; columns: profiler.runfolder.layout.COMM_COLUMNS). The α–β model of one collective over n
ranks (ring algorithms, as NCCL uses for large messages and as nccl-tests' bus bandwidth assumes):

    t(bytes, n) = steps(n) · α + bus_factor(n) · bytes / B

with steps(n) = 2(n−1) for all_reduce and n−1 for the others, and bus_factor from
`profiler.runfolder.layout.bus_factor` (the factors the trace analysis uses). α (µs per step) and B
(bus bandwidth, GB/s with GB = 1e9 B) are fitted to the measured medians by least squares on the
relative error (profiler.runfolder.commfit, the fit the benchmark writes into run.json too), so 4 B and
16 MiB messages weigh alike; the fit error is the mean and max of |model − measured| ÷ measured
over the sizes.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from profiler.runfolder.commcsv import read_comm_csv
from profiler.runfolder.commfit import fit_all, fit_alpha_beta
from profiler.runfolder.errors import InputError, safe_text
from profiler.runfolder.layout import COMM_COLUMNS, COMM_CSV, RUN_JSON, bus_factor, ring_steps
from profiler.runfolder.records import read_comm_record, record_kind

__all__ = [
    "COMM_COLUMNS",
    "collective_time_us",
    "fit_alpha_beta",
    "with_measured_curve",
    "contention_factor",
    "fit_all",
    "host_contention",
    "idle_penalty_us",
    "idle_table",
    "is_comm_run",
    "load_comm_run",
    "ring_steps",
]


def collective_time_us(model: dict, nbytes: float, n: int) -> float:
    """α–β time (µs) of one call moving `nbytes` over `n` ranks: steps(n)·α + factor(n)·bytes ÷ B,
    B the fitted bus bandwidth, or B(bytes) from the model's measured `curve` when it has one."""
    if n < 2:
        return 0.0  # one rank: nothing to exchange
    factor = bus_factor(model["collective"], n) or 1.0
    curve = model.get("curve")
    if curve:  # log-log interpolation between benchmarked sizes, flat beyond them
        x = np.log(curve["bytes"])
        bw = float(np.exp(np.interp(np.log(max(nbytes, 1.0)), x, np.log(curve["bus_gbps"]))))
    else:
        bw = model["bus_gbps"]
    return ring_steps(model["collective"], n) * model["alpha_us"] + factor * nbytes / (bw * 1e3)


def with_measured_curve(model: dict, nbytes: np.ndarray, time_us: np.ndarray) -> dict:
    """`model` plus `curve`: the bus bandwidth at each benchmarked size once the fitted latency is
    taken out, B(s) = factor(n₀)·s ÷ (t(s) − steps(n₀)·α). At the benchmark's own n the model
    then gives back the measured medians exactly (protocol and algorithm changes between sizes
    included), and other n still follow the ring formulas."""
    n0, name = model["world_size"], model["collective"]
    x = np.asarray(nbytes, dtype=float)
    t = np.asarray(time_us, dtype=float)
    keep = (x > 0) & (t > 0) & np.isfinite(t)
    x, t = x[keep], t[keep]
    order = np.argsort(x)
    x, t = x[order], t[order]
    factor = bus_factor(name, n0) or 1.0
    latency = ring_steps(name, n0) * model["alpha_us"]
    # latency above the measured time (noise at tiny sizes): keep at least 1% as transfer time
    transfer = np.maximum(t - latency, 0.01 * t)
    return {
        **model,
        "curve": {"bytes": x.tolist(), "bus_gbps": (factor * x / transfer / 1e3).tolist()},
    }


def idle_penalty_us(model: dict, nbytes: float, gap_ms: float) -> float:
    """Extra µs a call of `nbytes` pays when issued `gap_ms` of compute after the call before it,
    from the model's `idle_penalty` ({gap_ms, bytes, us[gap][size]}: mean after the gap − mean
    back-to-back, at least 0, at the benchmarked gaps and sizes): linear in log size between the
    sizes, then linear in the gap between the gaps, flat beyond both ranges; 0 without one."""
    pen = model.get("idle_penalty")
    if not pen:
        return 0.0
    x = np.log(pen["bytes"])
    at_size = [np.interp(np.log(max(nbytes, 1.0)), x, row) for row in pen["us"]]
    return float(np.interp(max(gap_ms, 0.0), pen["gap_ms"], at_size))


def idle_table(items: object, gaps: dict[str, float], means: dict) -> dict[str, dict]:
    """{collective: {gap_ms, bytes, us}} for idle_penalty_us, from run.json
    `metrics.idle_penalty` (the gap sweep: rows of collective, bytes, gap_ms and both means) on
    the gaps × sizes every one of them has; gap 0 reads as no penalty where the sweep lacks it.
    A comm run from before the sweep, timed after one `config.gap_ms` per collective with
    back-to-back means (`means`), gives gaps 0 and that one. Damaged rows are left out."""
    cols = ["collective", "bytes", "gap_ms", "time_us_mean", "time_us_mean_back_to_back"]
    rows = [m for m in items if isinstance(m, dict)] if isinstance(items, list) else []
    frame = pd.DataFrame(rows, columns=cols)
    for c in cols[1:]:
        frame[c] = pd.to_numeric(frame[c], errors="coerce")
    frame = frame[frame["collective"].map(lambda c: isinstance(c, str)).astype(bool)]
    frame = frame[(frame["bytes"] > 0) & (frame["gap_ms"] >= 0)].dropna()
    if frame.empty:  # a comm run from before the sweep: its one gap per collective, if any
        frame = _legacy_rows(gaps, means)
    out = {}
    for name, g in frame.groupby("collective"):
        pen = (g["time_us_mean"] - g["time_us_mean_back_to_back"]).clip(lower=0.0)
        grid = pen.groupby([g["gap_ms"], g["bytes"]]).mean().unstack("bytes").dropna(axis=1)
        if grid.empty:
            continue
        if 0.0 not in grid.index:
            grid.loc[0.0] = 0.0
        grid = grid.sort_index()
        out[str(name)] = {
            "gap_ms": [float(v) for v in grid.index],
            "bytes": [float(v) for v in grid.columns],
            "us": grid.to_numpy(dtype=float).tolist(),
        }
    return out


def _legacy_rows(gaps: dict[str, float], means: dict) -> pd.DataFrame:
    """The gap-sweep rows of a comm run timed after one `config.gap_ms` (before the sweep)."""
    rows = []
    for name, gap in gaps.items():
        m = means.get(name) or {}
        for b, t, hot in zip(m.get("bytes", []), m.get("time_us_mean", []),
                             m.get("time_us_mean_back_to_back", []), strict=False):  # fmt: skip
            rows.append({"collective": name, "bytes": b, "gap_ms": gap, "time_us_mean": t,
                         "time_us_mean_back_to_back": hot})  # fmt: skip
    cols = ["collective", "bytes", "gap_ms", "time_us_mean", "time_us_mean_back_to_back"]
    return pd.DataFrame(rows, columns=cols)


def host_contention(value: object) -> dict:
    """run.json `metrics.host_contention` as {device, ranks, slowdown, ...}: `slowdown[i]` the
    compute slowdown at `ranks[i]` busy ranks on one host (workloads.comm.host); {} when absent
    or damaged (a GPU comm run has a note and no slowdown)."""
    if not isinstance(value, dict):
        return {}
    ranks, slow = value.get("ranks"), value.get("slowdown")
    try:
        ok = len(ranks) == len(slow) > 0 and ranks[0] == 1
        ok = ok and all(int(k) == k >= 1 for k in ranks) and all(0 < float(v) < 1e3 for v in slow)
    except (TypeError, ValueError):
        ok = False
    out = {k: value[k] for k in ("device", "note", "kernel", "time_ms_alone") if k in value}
    if ok:
        out |= {"ranks": [int(k) for k in ranks], "slowdown": [float(v) for v in slow]}
    return out


def contention_factor(host: dict, ranks_per_node: int) -> float:
    """Compute slowdown at `ranks_per_node` co-located ranks: the measured one, linear between
    the measured counts, flat past the largest; 1 when nothing was measured (GPU) or at 1."""
    if not host.get("slowdown") or ranks_per_node <= 1:
        return 1.0
    return float(np.interp(ranks_per_node, host["ranks"], host["slowdown"]))


def is_comm_run(run_dir: Path) -> bool:
    """True when `run_dir/run.json` says `kind: "comm"` (a collective benchmark, not a training);
    False for an unreadable one (load_run then says what is wrong with it)."""
    return record_kind(Path(run_dir) / RUN_JSON) == "comm"


def load_comm_run(run_dir: Path) -> dict:
    """{run_id, path, backend, world_size, status, rows (list of comm.csv dicts), models, skipped,
    means, gap_ms, host_contention, idle (idle_table)}.

    Raises InputError (one line) when the folder is not a finished comm run.
    """
    run_dir = Path(run_dir)
    run_json = run_dir / RUN_JSON
    if run_json.is_file() and record_kind(run_json) != "comm":
        raise InputError(run_json, "is not a comm run", "pass a `make bench-comm` run folder")
    rec, raw = read_comm_record(run_json)  # one line (InputError) when missing or invalid
    # comm.csv through its typed reader: its rows must be at run.json's world size.
    rows = read_comm_csv(run_dir / COMM_CSV, world_size=rec.config.world_size)
    metrics = rec.metrics
    # The sweep's tables are checked row by row by their own readers (damaged rows left out).
    raw_metrics = raw.get("metrics") if isinstance(raw.get("metrics"), dict) else {}
    out = {
        "run_id": safe_text(rec.run_id or run_dir.name),
        "path": str(run_dir),
        "status": rec.status,
        "backend": rec.config.backend,
        "world_size": rec.config.world_size,
        "devices": rec.config.devices or [],
        "rows": rows.to_dict("records"),
        "models": fit_all(rows),
        "skipped": metrics.skipped,
        "means": _means([msgspec.structs.asdict(m) for m in metrics.time_us_mean], rows),
        "gap_ms": dict(rec.config.gap_ms or {}),
        "host_contention": host_contention(raw_metrics.get("host_contention")),
        # env.host_load as a dict, the form profiler.runfolder.hostload.is_busy and the runs JSON share
        "host_load": msgspec.to_builtins(rec.env.host_load) if rec.env.host_load else None,
    }
    out["idle"] = idle_table(raw_metrics.get("idle_penalty"), out["gap_ms"], out["means"])
    return out


def _means(items: object, rows: pd.DataFrame) -> dict[str, dict[str, list]]:
    """run.json `metrics.time_us_mean` as {collective: {bytes: [...], time_us_mean: [...]}} (plus
    `time_us_mean_back_to_back` for gap-timed runs), only finite positive times at sizes comm.csv
    has (older comm runs have none: {})."""
    rows_ = [m for m in items if isinstance(m, dict)] if isinstance(items, list) else []
    cols = ["collective", "bytes", "time_us_mean", "time_us_mean_back_to_back"]
    frame = pd.DataFrame(rows_, columns=cols)
    try:
        for c in cols[1:]:
            frame[c] = pd.to_numeric(frame[c], errors="coerce")
        ok = np.isfinite(frame["time_us_mean"]) & (frame["time_us_mean"] > 0)
        ok &= frame["collective"].map(lambda c: isinstance(c, str)).astype(bool)
        frame = frame.loc[ok]
        frame = frame.merge(rows[["collective", "bytes"]], on=["collective", "bytes"])
    except (TypeError, ValueError):  # a damaged field: the medians still serve
        return {}
    out = {}
    for name, g in frame.groupby("collective"):
        g = g.sort_values("bytes")
        hot = g["time_us_mean_back_to_back"]
        keep = cols[1:] if bool((np.isfinite(hot) & (hot > 0)).all()) else cols[1:3]
        out[str(name)] = g[keep].to_dict("list")  # back-to-back only when every size has one
    return out
