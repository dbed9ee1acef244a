"""The α–β (latency–bandwidth) fit of a comm benchmark, as `make bench-comm` writes it into
run.json `metrics.comm_model` and `analysis project` refits it from comm.csv.

Torch-free and below both halves, since the writer (workloads.comm.bench) and the reader
(analysis.project.comm) need the same fit. The model of one collective over n ranks:

    t(bytes, n) = steps(n) · α + bus_factor(n) · bytes / B

with steps and bus_factor from profiler.runfolder.layout (ring algorithms, nccl-tests' bus factors). α
(µs per step) and B (bus bandwidth, GB/s with GB = 1e9 B) are fitted to the measured times by
least squares on the relative error, so 4 B and 16 MiB messages weigh alike; the fit error is the
mean and max of |model − measured| ÷ measured over the sizes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.runfolder.layout import bus_factor, ring_steps

__all__ = ["fit_all", "fit_alpha_beta"]


def fit_alpha_beta(collective: str, n: int, nbytes: np.ndarray, time_us: np.ndarray) -> dict:
    """Fit α (µs/step) and B (GB/s) of `collective` at `n` ranks to measured (bytes, µs) points."""
    x = np.asarray(nbytes, dtype=float)
    t = np.asarray(time_us, dtype=float)
    keep = (x > 0) & (t > 0) & np.isfinite(t)
    x, t = x[keep], t[keep]
    steps = max(1, ring_steps(collective, n))
    factor = bus_factor(collective, n) or 1.0
    if x.size < 2:
        raise ValueError(f"{collective}: need at least two message sizes to fit α and B")
    # t = a + c·x with a = steps·α and c = factor / B (µs per byte); relative residuals.
    design = np.column_stack([1 / t, x / t])
    (a, c), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if c <= 0:  # latency-bound everywhere: bandwidth from the largest message alone
        c = float(t[-1] / x[-1])
        a = 0.0
    if a < 0:  # bandwidth-bound everywhere: refit the slope alone
        a, c = 0.0, float(np.sum(x / t) / np.sum((x / t) ** 2))
    err = np.abs(a + c * x - t) / t * 100
    return {
        "collective": collective,
        "world_size": int(n),
        "alpha_us": float(a / steps),
        "bus_gbps": float(factor / c / 1e3),
        "steps": steps,
        "bus_factor": factor,
        "fit_error_pct_mean": float(err.mean()),
        "fit_error_pct_max": float(err.max()),
        "bytes_min": int(x.min()),
        "bytes_max": int(x.max()),
        "points": int(x.size),
    }


def fit_all(rows: pd.DataFrame) -> dict[str, dict]:
    """One α–β fit per collective of a comm.csv frame (collectives with < 2 sizes are left out)."""
    out = {}
    for name, g in rows.groupby("collective", sort=False):
        g = g.sort_values("bytes")
        try:
            out[str(name)] = fit_alpha_beta(
                str(name), int(g["world_size"].iloc[0]), g["bytes"], g["time_us_median"]
            )
        except ValueError:
            continue
    return out
