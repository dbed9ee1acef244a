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
    "nondecreasing",
    "quantile_times",
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
    """{collective: {gap_ms, bytes, us, baseline, timing}} for idle_penalty_us, from run.json
    `metrics.idle_penalty` (the gap sweep: rows of collective, bytes, gap_ms and the means) on
    the gaps × sizes every one of them has. The first call's time is the last-arriving rank's
    (`time_us_mean_last_arrival`, `timing` "last arrival": the rank the others waited for, whose
    time holds no arrival skew, as the projection's traced comm is that rank's) where the sweep
    recorded it, else the slowest rank's (`time_us_mean`, "slowest rank"). A comm run from before the sweep, timed after one
    `config.gap_ms` per collective with back-to-back means (`means`), gives that one gap.
    Damaged rows are left out.

    The penalty of gap g at size s is what the gap adds to the first call after the barrier:
    max(0, mean(s, g) − mean(s, 0)), `baseline` "gap 0" (the back-to-back mean where the sweep has
    no gap 0: `baseline` "back-to-back"). So p(s, 0) = 0 exactly: a bucket queued behind the one
    before it (no gap) pays nothing, and the barrier's own arrival skew, in every first call of
    the sweep, is not charged as idle time. Then per size the penalties are made non-decreasing in
    the gap (isotonic regression, `nondecreasing`): a longer idle period cannot wake the transport
    faster, and a single noisy cell (5 calls) no longer sets the penalty of every gap near it."""
    cols = ["collective", "bytes", "gap_ms", "time_us_mean", "time_us_mean_back_to_back"]
    last = "time_us_mean_last_arrival"
    rows = [m for m in items if isinstance(m, dict)] if isinstance(items, list) else []
    frame = pd.DataFrame(rows, columns=[*cols, last])
    for c in [*cols[1:], last]:
        frame[c] = pd.to_numeric(frame[c], errors="coerce")
    frame = frame[frame["collective"].map(lambda c: isinstance(c, str)).astype(bool)]
    frame = frame[(frame["bytes"] > 0) & (frame["gap_ms"] >= 0)].dropna(subset=cols)
    frame = frame[np.isfinite(frame[cols[3:]]).all(axis=1)]
    if frame.empty:  # a comm run from before the sweep: its one gap per collective, if any
        frame = _legacy_rows(gaps, means).assign(**{last: np.nan})
    out = {}
    for name, g in frame.groupby("collective"):
        # the last rank to arrive holds no arrival skew: its times where the sweep has them
        timing = last if bool(np.isfinite(g[last]).all() & (g[last] > 0).all()) else cols[3]
        first = g.groupby(["gap_ms", "bytes"])[timing].mean().unstack("bytes").dropna(axis=1)
        if first.empty:
            continue
        swept0 = 0.0 in first.index
        hot = g.groupby("bytes")["time_us_mean_back_to_back"].mean()
        base = first.loc[0.0] if swept0 else hot.reindex(first.columns)
        grid = (first - base).clip(lower=0.0).dropna(axis=1)
        if grid.empty:
            continue
        if not swept0:
            grid.loc[0.0] = 0.0
        grid = grid.sort_index()
        us = np.column_stack([nondecreasing(grid[c].to_numpy(dtype=float)) for c in grid.columns])
        out[str(name)] = {
            "gap_ms": [float(v) for v in grid.index],
            "bytes": [float(v) for v in grid.columns],
            "us": us.tolist(),
            "baseline": "gap 0" if swept0 else "back-to-back",
            "timing": "last arrival" if timing == last else "slowest rank",
        }
    return out


def nondecreasing(y: np.ndarray) -> np.ndarray:
    """The least-squares non-decreasing fit to `y` (pool-adjacent-violators, equal weights):
    each run of values that decreases is replaced by its mean, e.g. [0, 3, 1, 5] -> [0, 2, 2, 5]."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in np.asarray(y, dtype=float).tolist():
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, c2), (m1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return np.repeat([b[0] for b in blocks], [int(b[1]) for b in blocks])


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
    compute slowdown at `ranks[i]` busy ranks on one host (workloads.comm.host), and its range over
    the measurement's rounds `slowdown_min`, `slowdown_max` when recorded and consistent; {} when
    absent or damaged (a GPU comm run has a note and no slowdown)."""
    if not isinstance(value, dict):
        return {}
    ranks, slow = value.get("ranks"), value.get("slowdown")
    ok = _slowdowns(ranks, slow) and all(int(k) == k >= 1 for k in ranks) and ranks[0] == 1
    out = {k: value[k] for k in ("device", "note", "kernel", "time_ms_alone") if k in value}
    if ok:
        out |= {"ranks": [int(k) for k in ranks], "slowdown": [float(v) for v in slow]}
        lo, hi = value.get("slowdown_min"), value.get("slowdown_max")
        if _slowdowns(ranks, lo) and _slowdowns(ranks, hi):
            lo, hi = [float(v) for v in lo], [float(v) for v in hi]
            if all(a <= m <= b for a, m, b in zip(lo, out["slowdown"], hi, strict=True)):
                out |= {"slowdown_min": lo, "slowdown_max": hi}
    return out


def _slowdowns(ranks: object, slow: object) -> bool:
    """True when `slow` is a list of plausible slowdowns, one per entry of `ranks`."""
    try:
        return len(ranks) == len(slow) > 0 and all(0 < float(v) < 1e3 for v in slow)
    except (TypeError, ValueError):
        return False


def contention_factor(host: dict, ranks_per_node: int, which: str = "slowdown") -> float:
    """Compute slowdown at `ranks_per_node` co-located ranks: the measured one (`which`:
    `slowdown`, or the range's `slowdown_min` / `slowdown_max`, the median where the comm run has
    no range), linear between the measured counts, flat past the largest; 1 when nothing was
    measured (GPU) or at 1."""
    if not host.get("slowdown") or ranks_per_node <= 1:
        return 1.0
    values = host.get(which) or host["slowdown"]
    return float(np.interp(ranks_per_node, host["ranks"], values))


def is_comm_run(run_dir: Path) -> bool:
    """True when `run_dir/run.json` says `kind: "comm"` (a collective benchmark, not a training);
    False for an unreadable one (load_run then says what is wrong with it)."""
    return record_kind(Path(run_dir) / RUN_JSON) == "comm"


def load_comm_run(run_dir: Path) -> dict:
    """{run_id, path, backend, world_size, status, rows (list of comm.csv dicts), models, skipped,
    means, gap_ms, host_contention, idle (idle_table), last_arrival ({mean, p5, p95}: quantile_times
    of the last-arriving rank's back-to-back times, `time_us_<stat>_last_arrival`)}.

    Raises InputError (one line) when the folder is not a finished comm run.
    """
    run_dir = Path(run_dir)
    run_json = run_dir / RUN_JSON
    if run_json.is_file() and record_kind(run_json) != "comm":
        raise InputError(run_json, "is not a comm run", "pass a `make bench-comm` run folder")
    rec, raw = read_comm_record(run_json)  # one line (InputError) when missing or invalid
    # comm.csv through its typed reader: its rows must be at run.json's world size.
    rows = read_comm_csv(run_dir / COMM_CSV, world_size=rec.config.world_size)
    _check_times(run_dir / COMM_CSV, rows)
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
    items = raw_metrics.get("time_us_mean")
    out["last_arrival"] = {
        stat: quantile_times(items, f"time_us_{stat}_last_arrival", rows)
        for stat in ("mean", "p5", "p95")
    }
    return out


def quantile_times(items: object, key: str, rows: pd.DataFrame) -> dict[str, dict[str, list]]:
    """{collective: {bytes, time_us}} of run.json `metrics.time_us_mean` items' `key` (e.g.
    `time_us_p5_last_arrival`: the 5th percentile of the last-arriving rank's times over the
    iterations), at the sizes comm.csv has;
    a collective with a size missing, non-finite or not positive is left out (comm runs from
    before the field have none: {})."""
    rows_ = [m for m in items if isinstance(m, dict)] if isinstance(items, list) else []
    frame = pd.DataFrame(rows_, columns=["collective", "bytes", key])
    frame["bytes"] = pd.to_numeric(frame["bytes"], errors="coerce")
    frame[key] = pd.to_numeric(frame[key], errors="coerce")
    frame = frame[frame["collective"].map(lambda c: isinstance(c, str)).astype(bool)]
    out = {}
    for name, want in rows.groupby("collective")["bytes"]:
        g = frame[frame["collective"] == name].drop_duplicates("bytes").set_index("bytes")[key]
        t = g.reindex(sorted(want)).to_numpy(dtype=float)
        if t.size and bool((np.isfinite(t) & (t > 0)).all()):
            out[str(name)] = {"bytes": [float(b) for b in sorted(want)], "time_us": t.tolist()}
    return out


TIME_US_RANGE = (1e-3, 86400e6)
"""The collective times (µs) a comm run may hold: 1 ns to 1 day. Outside it (0, a subnormal, an
overflow) the record is damaged, and the α–β fit over it would be meaningless."""


def _check_times(path: Path, rows: pd.DataFrame) -> None:
    """One line (InputError) when a comm.csv time is not a real collective time."""
    lo, hi = TIME_US_RANGE
    for col in ("time_us_median", "time_us_p95"):
        t = rows[col].to_numpy(dtype=float)
        bad = ~((t >= lo) & (t <= hi))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(
                path,
                f"cannot project: {col} {t[i]:.3g} µs of {rows['collective'].iloc[i]} at "
                f"{int(rows['bytes'].iloc[i])} B is not a real collective time (1 ns to 1 day)",
                "re-run make bench-comm",
            )


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
