"""Report tables: rows built from the runs JSON of `compare_runs`, one column spec per table.

Every cell keeps the raw JSON value (written to the CSV and to the HTML `data-value` attribute, so
tests and sorting see the exact numbers) next to its display text; units live in the headers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd

from analysis.columns import (
    ACCURACY_COLS,
    COLLECTIVE_COLS,
    ENV_COLS,
    HEADLINE_COLS,
    MEMORY_COLS,
    OVERLAP_COLS,
    PHASE_COLS,
    SPEEDUP_COLS,
    STRAGGLER_COLS,
    SUMMARY_COLS,
    TRACE_COLS,
    Column,
    fmt,
    missing,
)
from analysis.report.scaling import headline_rows
from analysis.runs.entry import is_measured

__all__ = ["Column", "Table", "all_tables", "fmt", "run_label", "run_reason", "unique_labels"]


@dataclass(kw_only=True)
class Table:
    """A titled table; `csv` names the file it is also written to (None: HTML only)."""

    id: str
    columns: list[Column]
    rows: list[dict[str, Any]] = field(default_factory=list)
    csv: str | None = None
    csv_only: frozenset[str] = frozenset()  # keys written to the CSV but not shown on the page

    @property
    def visible_columns(self) -> list[Column]:
        """Columns to show: a numeric column empty in every row (e.g. CUDA memory on CPU) is hidden,
        and so are the `csv_only` ones."""
        return [
            c
            for c in self.columns
            if c.key not in self.csv_only
            and (not c.numeric or any(not missing(r.get(c.key)) for r in self.rows))
        ]

    def frame(self) -> pd.DataFrame:
        keys = []
        for c in self.columns:
            keys.append(c.key)
            if c.std_key:
                keys.append(c.std_key)
        return pd.DataFrame(
            [{k: _csv_value(r.get(k)) for k in keys} for r in self.rows], columns=keys
        )


def _csv_value(v: Any) -> Any:
    if isinstance(v, list):
        return ";".join(str(x.get("text", x)) if isinstance(x, dict) else str(x) for x in v)
    return v


def run_reason(run: dict[str, Any]) -> str:
    """One line saying why a run has no numbers ('' when it is fine)."""
    err = run.get("error")
    if not err:
        return ""
    if isinstance(err, dict):
        where = f" (rank {err['rank']})" if err.get("rank") is not None else ""
        kind = f"{err['kind']}: " if err.get("kind") else ""  # crash, killed, oom, diverged, ...
        first_line = (str(err.get("message") or "failed").splitlines() or ["failed"])[0]
        return f"{kind}{first_line}{where}"
    return str(err)


def run_label(run: dict[str, Any]) -> str:
    """Short label for figures: mode, backend, world size and seed."""
    pieces = [str(run.get("mode") or "?")]
    if run.get("backend") not in (None, "none", "dp"):
        pieces.append(str(run["backend"]))
    pieces.append(f"n{run.get('world_size') or '?'}")
    if run.get("seed") is not None:
        pieces.append(f"s{run['seed']}")
    return "·".join(pieces)


def unique_labels(runs: list[dict[str, Any]]) -> dict[str, str]:
    """run_id -> label, adding the OS and then a counter where labels would collide."""
    labels = {r["run_id"]: run_label(r) for r in runs}
    oses = {r.get("os") for r in runs}
    if len(oses) > 1:
        labels = {r["run_id"]: f"{labels[r['run_id']]}·{r.get('os') or '?'}" for r in runs}
    seen: dict[str, int] = {}
    for rid, lab in list(labels.items()):
        seen[lab] = seen.get(lab, 0) + 1
        if seen[lab] > 1:
            labels[rid] = f"{lab}#{seen[lab]}"
    return labels


def _ok(run: dict[str, Any]) -> bool:
    return is_measured(run)


def _trace_ranks(run: dict[str, Any]) -> dict[int, dict[str, Any]]:
    trace = run.get("trace") or {}
    return {r["rank"]: r for r in trace.get("ranks") or []}


def _link(path: Path, out_dir: Path) -> dict[str, str]:
    """Link relative to the report (it travels with the runs); absolute across Windows drives.
    Callers pass only files inside a run folder (analysis.runs.entry drops any other)."""
    try:
        href = quote(Path(os.path.relpath(path.resolve(), out_dir.resolve())).as_posix())
    except ValueError:  # different drive: no relative path exists
        href = path.resolve().as_uri()
    return {"href": href, "text": path.name}


def summary_rows(data: dict[str, Any], labels: dict[str, str]) -> list[dict[str, Any]]:
    rows = [
        {
            **{k: r.get(k) for c in SUMMARY_COLS for k in (c.key, c.text_key) if k},
            "label": labels.get(r["run_id"], ""),
            # ok runs can still miss numbers (a cut-off trace): say which and why.
            "reason": run_reason(r) or "; ".join(r.get("warnings") or []),
        }
        for r in data.get("runs", [])
    ]
    for s in data.get("skipped", []):
        rows.append({"run_id": Path(s["path"]).name, "status": "unreadable", "reason": s["reason"]})
    for s in data.get("invalid", []):  # broke the run-folder contract: never analysed
        rows.append({"run_id": Path(s["path"]).name, "status": "invalid", "reason": s["reason"]})
    return rows


def phase_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per run and rank: steps.csv phases, with exposed comm carved out of DDP's backward.

    DDP's allreduce runs inside backward (bucket hooks), so exposed comm is already part of
    backward_s; stacking it on top would count it twice. The traces cover only the few profiled
    steps, which run slower than the rest (profiler overhead), so the trace's exposed share of its
    step is applied to this rank's steps.csv step time, and capped at backward: the bar then adds
    up to the measured step time instead of outgrowing it.
    """
    rows = []
    for run in filter(_ok, data.get("runs", [])):
        ranks = _trace_ranks(run)
        for p in run.get("phases_per_rank_s") or []:
            tr = ranks.get(p["rank"], {})
            exposed, traced = tr.get("exposed_comm_us"), tr.get("step_time_us_mean")
            step, back = p.get("step_time"), p.get("backward")
            exposed_s = None
            if exposed is not None and traced and step is not None:
                exposed_s = exposed / traced * step
                if back is not None:
                    exposed_s = min(exposed_s, back)
            back_c = (
                back - exposed_s
                if back is not None and exposed_s is not None and run.get("mode") == "ddp"
                else back
            )
            phase_times = [p.get("data"), p.get("forward"), back, p.get("optimizer")]
            other = None
            if p.get("step_time") is not None and None not in phase_times:
                other = max(p["step_time"] - sum(phase_times), 0.0)
            rows.append(
                {
                    "run_id": run["run_id"],
                    "rank": p["rank"],
                    "data_s": p.get("data"),
                    "forward_s": p.get("forward"),
                    "backward_s": back,
                    "backward_compute_s": back_c,
                    "exposed_comm_s": exposed_s if run.get("mode") == "ddp" else None,
                    "optimizer_s": p.get("optimizer"),
                    "other_s": other,
                    "step_time_s": p.get("step_time"),
                }
            )
    return rows


def trace_rows(data: dict[str, Any]) -> tuple[list, list, list]:
    """Collectives, per-rank overlap and straggler rows from each run's analysed traces."""
    coll, overlap, strag = [], [], []
    for run in data.get("runs", []):
        trace = run.get("trace") or {}
        rid = run["run_id"]
        coll += [{"run_id": rid, **c} for c in trace.get("collectives") or []]
        for r in trace.get("ranks") or []:
            tb = r.get("tb_split") or {}
            overlap.append(
                {
                    "run_id": rid,
                    **{
                        k: r.get(k)
                        for k in (
                            "rank",
                            "steps",
                            "step_time_us_mean",
                            "comm_us",
                            "exposed_comm_us",
                            "overlap_pct",
                        )
                    },
                    **{f"tb_{k}": v for k, v in tb.items()},
                }
            )
        spread = (trace.get("step_time_spread") or {}).get("spread_pct")
        strag += [{"run_id": rid, **s, "spread_pct": spread} for s in trace.get("stragglers") or []]
    return coll, overlap, strag


def memory_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for run in filter(_ok, data.get("runs", [])):
        for m in run.get("memory") or []:
            rows.append(
                {
                    "run_id": run["run_id"],
                    **m,
                    "memory_imbalance_pct": run.get("memory_imbalance_pct"),
                    "memory_imbalance_max_over_mean": run.get("memory_imbalance_max_over_mean"),
                }
            )
    return rows


def env_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [{c.key: run.get(c.key) for c in ENV_COLS} for run in data.get("runs", [])]
    # Platform first, then backend: Linux vs Windows and NCCL vs GLOO end up next to each other.
    return sorted(rows, key=lambda r: (str(r["os"]), str(r["backend"]), str(r["run_id"])))


def trace_link_rows(data: dict[str, Any], out_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for run in data.get("runs", []):
        folder = Path(run["path"])
        rows.append(
            {
                "run_id": run["run_id"],
                "status": run.get("status"),
                "kind": (run.get("trace") or {}).get("kind"),
                "trace_links": [_link(folder / t, out_dir) for t in run.get("trace_files") or []],
                "log_links": [_link(folder / p, out_dir) for p in run.get("logs") or []],
            }
        )
    return rows


def all_tables(data: dict[str, Any], out_dir: Path, labels: dict[str, str]) -> dict[str, Table]:
    """Every report table keyed by id (`labels`: run_id -> the report's one label of each run);
    CSV names are the ones the report promises."""
    coll, overlap, strag = trace_rows(data)
    return {
        "summary": Table(
            id="summary",
            columns=SUMMARY_COLS,
            rows=summary_rows(data, labels),
            csv="summary.csv",
            # The Run column shows the label (OS included when runs differ by it; full id: tooltip).
            csv_only=frozenset({"label", "os"}),
        ),
        "phases": Table(id="phases", columns=PHASE_COLS, rows=phase_rows(data), csv="phases.csv"),
        "collectives": Table(
            id="collectives", columns=COLLECTIVE_COLS, rows=coll, csv="collectives.csv"
        ),
        "overlap": Table(id="overlap", columns=OVERLAP_COLS, rows=overlap, csv="overlap.csv"),
        "stragglers": Table(
            id="stragglers", columns=STRAGGLER_COLS, rows=strag, csv="stragglers.csv"
        ),
        "memory": Table(id="memory", columns=MEMORY_COLS, rows=memory_rows(data), csv="memory.csv"),
        "speedup": Table(
            id="speedup", columns=SPEEDUP_COLS, rows=list(data.get("groups", [])), csv="speedup.csv"
        ),
        "accuracy": Table(
            id="accuracy",
            columns=ACCURACY_COLS,
            rows=list(data.get("groups", [])),
            csv="accuracy.csv",
        ),
        "environment": Table(
            id="environment", columns=ENV_COLS, rows=env_rows(data), csv="environment.csv"
        ),
        "traces": Table(id="traces", columns=TRACE_COLS, rows=trace_link_rows(data, out_dir)),
        "headline": Table(
            id="headline", columns=HEADLINE_COLS, rows=headline_rows(data), csv="headline.csv"
        ),
    }
