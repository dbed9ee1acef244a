"""The band on every prediction: the projection re-run with each measured input at the low and at
the high end of its measured spread (definitions: docs/reference/metrics.md §10, "Bands").

Three inputs carry a measured spread, and each band end takes all of them at that end together
(the step time grows with every one of them):

- **compute** (`compute_spread`): the 5th and 95th percentiles of RUN's per-step compute over its
  measured steps and ranks (a DDP run's minus its traced exposed share), pooled with the steps of
  `--seed-runs` (the same workload with other seeds, scaled the same way), each ÷ RUN's mean:
  every compute phase × that factor.
- **comm** (`comm_models`): the comm run's times per message size at their 5th and 95th
  percentile (the last-arriving rank's, run.json `metrics.time_us_mean[]`
  `time_us_p5_last_arrival` / `time_us_p95_last_arrival`; comm runs without them: comm.csv's
  median and p95), through the same α–β curve as the point estimate's means; and the idle penalty from 0 (the ranks arrive at a bucket apart, so the early ones'
  transport wakes while they wait: all hidden) to the sweep's (ranks arrive together, as in the
  sweep: all paid).
- **contention**: the comm run's host-contention range over its rounds (`slowdown_min` to
  `slowdown_max`, workloads/comm/host.py), in the same ratio c(n) ÷ c(RUN) as the median.

`step_time_s_low` / `_high` are the smallest / largest step of the two ends and the point
estimate (so low ≤ step ≤ high always); the speedup of each end divides by the n = 1 projection
at the same end (a slower compute slows one rank and n ranks alike), and its band is the smallest /
largest of the three; efficiency = speedup ÷ n.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.project.comm import fit_alpha_beta, with_measured_curve
from analysis.project.model import ProjectionInputs
from analysis.project.step import contention_ratio, predict_step

__all__ = [
    "band_ends",
    "BAND_QUANTILES",
    "band_fields",
    "band_text",
    "comm_model",
    "comm_models",
    "compute_spread",
]

BAND_QUANTILES = (5.0, 95.0)
"""The percentiles of every measured spread that the band's two ends take."""


def comm_model(comm: dict, name: str, bandwidth: str) -> dict:
    """The α–β model of `name` from the comm run (docs/reference/metrics.md §10), with the comm run's
    `idle_penalty` table (analysis.project.comm.idle_table) when it has one. With `measured`
    bandwidth, the per-size curve of the benchmark's mean times (a mean step is what is projected:
    heavy-tailed collective times make the median too low): the last-arriving rank's where the
    comm run has them (`time_statistic` "mean, last arrival": the collective without the ranks'
    arrival skew, which the straggler term holds), else the slowest rank's ("mean"), else its
    medians. A comm run from before the gap sweep, timed after one gap with back-to-back means:
    α, B and the curve from those back-to-back means."""
    model = _bandwidth_model(comm, name, bandwidth)
    if name in comm["idle"]:
        model["idle_penalty"] = comm["idle"][name]
    return model


def _bandwidth_model(comm: dict, name: str, bandwidth: str) -> dict:
    n0 = comm["models"][name]["world_size"]
    model = dict(comm["models"][name], time_statistic="median")
    last = (comm.get("last_arrival") or {}).get("mean", {}).get(name)
    if last is not None and len(last["bytes"]) >= 2:
        model = dict(fit_alpha_beta(name, n0, last["bytes"], last["time_us"]))
        model["time_statistic"] = "mean, last arrival"
        return model if bandwidth == "fit" else with_measured_curve(
            model, last["bytes"], last["time_us"])  # fmt: skip
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


def comm_models(comm: dict, name: str, bandwidth: str, point: dict) -> tuple[dict, dict, str]:
    """(low, high, words): `point` rebuilt from the comm run's 5th / 95th-percentile times per
    size (the module docstring): the last-arriving rank's where recorded, else comm.csv's median
    and p95 (the slowest rank's); a comm run from before the gap sweep (comm.csv timed after its
    gap) gives `point` at both ends."""
    rows = pd.DataFrame(comm["rows"])
    rows = rows[rows["collective"] == name].sort_values("bytes")
    if (comm["means"].get(name) or {}).get("time_us_mean_back_to_back") is not None:
        return point, point, "comm times as benchmarked after its gap (no back-to-back spread)"
    last = comm.get("last_arrival") or {}
    p5, p95 = (last.get(q, {}).get(name) for q in ("p5", "p95"))
    if p5 and p95:
        ends_t = [(p5["bytes"], p5["time_us"]), (p95["bytes"], p95["time_us"])]
        words = f"{name} p5–p95 per message size (last-arriving rank)"
    else:
        x = rows["bytes"].tolist()
        ends_t = [(x, rows["time_us_median"].tolist()), (x, rows["time_us_p95"].tolist())]
        words = f"{name} median–p95 per message size (slowest rank; no p5 recorded)"
    ends = []
    for x, t in ends_t:
        base = {k: v for k, v in point.items() if k not in ("curve", "idle_penalty")}
        if bandwidth == "fit":
            m = fit_alpha_beta(name, base["world_size"], x, t)
        else:
            m = with_measured_curve(base, x, t)
        if "idle_penalty" in point:
            m["idle_penalty"] = point["idle_penalty"]
        ends.append(m)
    return ends[0], ends[1], words


def compute_spread(
    run: ProjectionInputs, seeds: list[ProjectionInputs]
) -> tuple[float, float, str]:
    """(low, high, words): the compute factors of the module docstring."""
    own = np.asarray(run.step_samples_s, dtype=float)
    mean = float(own.mean()) if own.size else 0.0
    if not mean > 0:
        return 1.0, 1.0, "no per-step compute samples"
    ratio = run.compute_s / run.step_time_s if run.step_time_s else 1.0
    pool = np.concatenate([own, *(np.asarray(s.step_samples_s) * ratio for s in seeds)])
    lo, hi = np.percentile(pool, BAND_QUANTILES) / mean
    words = f"p5–p95 of the per-step compute over {own.size} rank-steps of {run.run_id}"
    if seeds:
        words += f" and {pool.size - own.size} of {len(seeds)} seed run(s)"
    return min(1.0, float(lo)), max(1.0, float(hi)), words


def _ends(run: ProjectionInputs, n: int, kw: dict, ends: dict) -> list[tuple[dict, dict]]:
    """(prediction at n, prediction at 1) at the point estimate and at each band end."""
    out = []
    for knobs in ({}, ends["low"], ends["high"]):
        args = {**kw, **knobs}
        out.append((predict_step(run, n, **args), predict_step(run, 1, **args)))
    return out


def band_fields(run: ProjectionInputs, n: int, kw: dict, ends: dict) -> dict:
    """The band fields of the prediction at n (the module docstring): step_time_s_low/high,
    speedup_low/high, scaling_efficiency_low/high and band_sources."""
    preds = _ends(run, n, kw, ends)
    steps = [p["step_time_s"] for p, _ in preds]
    speedups = [p["samples_per_s"] / one["samples_per_s"] for p, one in preds]
    lo_c, hi_c = ends["low"]["knobs"].compute_scale, ends["high"]["knobs"].compute_scale
    sources = [{"term": "compute", "low": lo_c, "high": hi_c, "unit": "×",
                "source": ends["words"]["compute"]}]  # fmt: skip
    if n > 1:
        comm = [p["exposed_comm_s"] for p, _ in preds]
        sources.append({"term": "exposed_comm_s", "low": min(comm), "high": max(comm), "unit": "s",
                        "source": ends["words"]["comm"]})  # fmt: skip
    gpn, host = kw["gpn"], kw["host"]
    ratios = [contention_ratio(run, n, gpn, host, w) for w in ("slowdown_min", "slowdown_max")]
    if host.get("slowdown_min") and min(n, gpn) != min(run.world_size, gpn):
        sources.append({"term": "contention_factor", "low": min(ratios), "high": max(ratios),
                        "unit": "×", "source": ends["words"]["contention"]})  # fmt: skip
    return band_ends(steps, speedups, n, sources)


def band_ends(steps: list[float], speedups: list[float], n: int, sources: list[dict]) -> dict:
    """The band fields from the step times and speedups at the point estimate and the band's
    ends (each mode's projection computes them its own way)."""
    return {
        "step_time_s_low": min(steps),
        "step_time_s_high": max(steps),
        "speedup_low": min(speedups),
        "speedup_high": max(speedups),
        "scaling_efficiency_low": min(speedups) / n,
        "scaling_efficiency_high": max(speedups) / n,
        "band_sources": sources,
    }


def band_text(value: float, low: float, high: float, fmt: str = "{:.2f}", unit: str = "") -> str:
    """`value` with its band, e.g. band_text(1.7, 1.5, 1.9, "{:.1f}", "×") -> "1.7× (1.5–1.9×)"."""
    return f"{fmt.format(value)}{unit} ({fmt.format(low)}–{fmt.format(high)}{unit})"
