"""Collective benchmark results (`make bench-comm` run folders) and their latency–bandwidth model.

A comm run folder holds `run.json` with `kind: "comm"` and `comm.csv` (one row per collective and
message size; columns: profiler.runfolder.COMM_COLUMNS). The α–β model of one collective over n
ranks (ring algorithms, as NCCL uses for large messages and as nccl-tests' bus bandwidth assumes):

    t(bytes, n) = steps(n) · α + bus_factor(n) · bytes / B

with steps(n) = 2(n−1) for all_reduce and n−1 for the others, and bus_factor from
`profiler.runfolder.bus_factor` (the factors the trace analysis uses). α (µs per step) and B
(bus bandwidth, GB/s with GB = 1e9 B) are fitted to the measured medians by least squares on the
relative error (profiler.commfit, the fit the benchmark writes into run.json too), so 4 B and
16 MiB messages weigh alike; the fit error is the mean and max of |model − measured| ÷ measured
over the sizes.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from analysis.errors import AnalysisError
from profiler.commcsv import read_comm_csv
from profiler.commfit import fit_all, fit_alpha_beta
from profiler.inputfile import safe_text
from profiler.records import read_comm_record, record_kind
from profiler.runfolder import COMM_COLUMNS, COMM_CSV, RUN_JSON, bus_factor, ring_steps

__all__ = [
    "COMM_COLUMNS",
    "collective_time_us",
    "fit_alpha_beta",
    "with_measured_curve",
    "fit_all",
    "idle_penalty_us",
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


def idle_penalty_us(model: dict, nbytes: float) -> float:
    """Extra µs a call pays when issued after compute rather than back-to-back, from the model's
    `idle_penalty` ({bytes, us} at the benchmarked sizes: mean after the gap − mean back-to-back,
    at least 0): linear in log size between them, flat beyond the range; 0 without one."""
    pen = model.get("idle_penalty")
    if not pen:
        return 0.0
    x, y = np.log(pen["bytes"]), np.asarray(pen["us"], dtype=float)
    return float(np.interp(np.log(max(nbytes, 1.0)), x, y))


def is_comm_run(run_dir: Path) -> bool:
    """True when `run_dir/run.json` says `kind: "comm"` (a collective benchmark, not a training);
    False for an unreadable one (load_run then says what is wrong with it)."""
    return record_kind(Path(run_dir) / RUN_JSON) == "comm"


def load_comm_run(run_dir: Path) -> dict:
    """{run_id, path, backend, world_size, status, rows (list of comm.csv dicts), models, skipped}.

    Raises AnalysisError (one line) when the folder is not a finished comm run.
    """
    run_dir = Path(run_dir)
    run_json = run_dir / RUN_JSON
    if run_json.is_file() and record_kind(run_json) != "comm":
        raise AnalysisError(run_json, "is not a comm run", "pass a `make bench-comm` run folder")
    rec, _ = read_comm_record(run_json)  # one line (InputError) when missing or invalid
    # comm.csv through its typed reader: its rows must be at run.json's world size.
    rows = read_comm_csv(run_dir / COMM_CSV, world_size=rec.config.world_size)
    metrics = rec.metrics
    return {
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
    }


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
