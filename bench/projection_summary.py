"""`make bench-projection`'s summary over its rounds (bench/projection.py): per workload and arm
the median error, its range and, for the banded arms, the coverage; the markdown table the docs
show (docs/guides/projection.md, "Projection accuracy") and the flat JSON `make docs` renders.

Error = (projected − measured) ÷ measured × 100. Coverage = the share of rounds whose measured
step lies inside the projection's band (`in_band` of the projection JSON's check).
"""

from __future__ import annotations

import numpy as np

__all__ = ["bench_results", "markdown_table", "summary"]

COLUMNS = (
    ("weak", "weak (single → 2)"),
    ("weak_ddp1", "DDP 1 → 2"),
    ("replay", "replay"),
    ("self_replay", "self-replay"),
    ("exposed", "exposed comm"),
)


def _arm(rows: list[dict], key: str, goal: float, banded: bool, coverage_goal: float) -> dict:
    """One arm of one workload over the rounds that have a number for it."""
    errs = [r[key]["error_pct"] for r in rows if r[key].get("error_pct") is not None]
    med = float(np.median(errs)) if errs else None
    out = {
        "median_error_pct": med,
        "min_error_pct": min(errs) if errs else None,
        "max_error_pct": max(errs) if errs else None,
        "errors_pct": errs,
        "rounds": len(errs),
        "goal_pct": goal,
        "met": med is not None and abs(med) <= goal,
    }
    if banded:
        inside = [bool(r[key].get("in_band")) for r in rows]
        out["covered"] = sum(inside)
        out["coverage"] = sum(inside) / len(inside) if inside else None
        out["coverage_met"] = bool(inside) and out["coverage"] >= coverage_goal
    return out


def summary(
    rounds: list[dict], names: list[str], goals: dict, banded: tuple, coverage_goal: float
) -> dict:
    """Per workload: every arm (`_arm`), the DDP step range (ms) and the median contention of two
    single-device runs at once (%)."""
    out = {}
    for name in names:
        rows = [rnd["workloads"][name] for rnd in rounds]
        arms = {k: _arm(rows, k, goals[k], k in banded, coverage_goal) for k, _ in COLUMNS}
        steps = [1e3 * r["replay"]["measured_step_time_s"] for r in rows]
        arms["ddp_step_ms"] = [min(steps), max(steps)]
        pair = [r["pair_contention_pct"] for r in rows]
        arms["pair_contention_pct_median"] = float(np.median(pair))
        out[name] = arms
    return out


def _cell(a: dict, banded: bool) -> str:
    """`−1.2% (−20.0 … +10.1), in band 3/3`, the median in bold when it misses its goal."""
    if a["median_error_pct"] is None:
        return "—"
    med = f"{a['median_error_pct']:+.1f}%"
    text = (med if a["met"] else f"**{med}**") + (
        f" ({a['min_error_pct']:+.1f} … {a['max_error_pct']:+.1f})" if a["rounds"] > 1 else ""
    )
    if banded:
        cov = f"in band {a['covered']}/{a['rounds']}"
        text += ", " + (cov if a["coverage_met"] else f"**{cov}**")
    return text.replace("-", "−")


def markdown_table(summ: dict, repeats: int, banded: tuple, coverage_goal: float) -> str:
    """The docs' table: one row per workload, one column per arm, then the goals line."""
    head = "| workload | DDP step | " + " | ".join(label for _, label in COLUMNS) + " |"
    lines = [head, "|---" * (len(COLUMNS) + 2) + "|"]
    met = total = 0
    for name, arms in summ.items():
        lo, hi = arms["ddp_step_ms"]
        cells = [_cell(arms[k], k in banded) for k, _ in COLUMNS]
        lines.append(f"| {name} | {lo:,.0f}–{hi:,.0f} ms | " + " | ".join(cells) + " |")
        for k, _ in COLUMNS:
            met += arms[k]["met"] + arms[k].get("coverage_met", 0)
            total += 1 + (k in banded)
    goals = next(iter(summ.values())) if summ else {}
    words = ", ".join(f"|{label}| ≤ {goals[k]['goal_pct']:g}%" for k, label in COLUMNS if goals)
    lines += [
        "",
        f"Medians of {repeats} interleaved round(s), the rounds' range in brackets; in band = "
        f"rounds whose measured step lies inside the band. Goals: {words}, coverage ≥ "
        f"{100 * coverage_goal:.0f}%; met {met} of {total} (missed in bold).",
    ]
    return "\n".join(lines) + "\n"


def bench_results(summ: dict) -> dict:
    """{workload: {arm_median_error_pct, arm_coverage, ...}}: the flat numbers docs/benchmarks.md
    lists (bench/docs.py shows two levels under `results`)."""
    out = {}
    for name, arms in summ.items():
        row = {}
        for k, _ in COLUMNS:
            row[f"{k}_median_error_pct"] = arms[k]["median_error_pct"]
            row[f"{k}_met"] = arms[k]["met"]
            if "coverage" in arms[k]:
                row[f"{k}_coverage"] = arms[k]["coverage"]
        row["ddp_step_ms_min"], row["ddp_step_ms_max"] = arms["ddp_step_ms"]
        out[name] = row
    return out
