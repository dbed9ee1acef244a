"""Report tables: one column spec per table (analysis.columns) over rows of the typed runs JSON
and of analysis.runs' typed rows, each row a mapping from column key to its value.

Every cell keeps the raw JSON value (written to the CSV and to the HTML `data-value` attribute, so
tests and sorting see the exact numbers) next to its display text; units live in the headers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec
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
from analysis.report.labels import Labels, run_label, unique_labels
from analysis.report.scaling import group_label
from analysis.runs.notes import run_reason
from analysis.runs.rows import memory_rows, phase_rows, trace_rows
from analysis.runs.runsjson import RunsJson, read_runs_json
from analysis.runs.sweep import headline_rows

__all__ = [
    "Column",
    "Table",
    "all_tables",
    "fmt",
    "run_label",
    "summary_rows",
    "unique_labels",
]


@dataclass(kw_only=True)
class Table:
    """A titled table; `csv` names the file it is also written to (None: HTML only)."""

    id: str
    columns: list[Column]
    rows: list[dict[str, Any]] = field(default_factory=list)
    csv: str | None = None
    csv_only: frozenset[str] = frozenset()  # keys written to the CSV but not shown on the page
    # keys shown only when the rows differ in them (the platform of a one-OS report says nothing)
    only_if_varied: frozenset[str] = frozenset()
    # key -> the key that stands for it: hidden when every row holds the other (the mean ± std
    # of a group's speedup where its median [95% CI] over the rounds is shown)
    unless_shown: dict[str, str] = field(default_factory=dict)

    @property
    def visible_columns(self) -> list[Column]:
        """Columns to show: a numeric column empty in every row (e.g. CUDA memory on CPU) is hidden,
        and so are the `csv_only` ones, the `only_if_varied` ones with one value in every row and
        the `unless_shown` ones whose stand-in every row holds."""
        return [
            c
            for c in self.columns
            if c.key not in self.csv_only
            and (not c.numeric or any(not missing(r.get(c.key)) for r in self.rows))
            and (c.key not in self.only_if_varied or len({r.get(c.key) for r in self.rows}) > 1)
            and not (
                c.key in self.unless_shown
                and all(not missing(r.get(self.unless_shown[c.key])) for r in self.rows)
            )
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
        return ";".join(
            str(x["text"]) if isinstance(x, dict) and "text" in x else str(x) for x in v
        )
    return v


def _link(path: Path, out_dir: Path) -> dict[str, str]:
    """Link relative to the report (it travels with the runs); absolute across Windows drives.
    Callers pass only files inside a run folder (analysis.runs.entry drops any other)."""
    try:
        href = quote(Path(os.path.relpath(path.resolve(), out_dir.resolve())).as_posix())
    except ValueError:  # different drive: no relative path exists
        href = path.resolve().as_uri()
    return {"href": href, "text": path.name}


_SUMMARY_KEYS = tuple(dict.fromkeys(k for c in SUMMARY_COLS for k in (c.key, c.text_key) if k))


def summary_rows(data: RunsJson | dict[str, Any], labels: Labels) -> list[dict[str, Any]]:
    """One row per run (its SUMMARY_COLS fields, label and why it has no numbers or its
    warnings), then one per unreadable and per invalid folder."""
    doc = read_runs_json(data)
    run_keys = [k for k in _SUMMARY_KEYS if k not in ("label", "reason")]
    rows = [
        {
            **{k: getattr(r, k) for k in run_keys},
            "label": labels[r.run_id] if r.run_id in labels else "",
            # ok runs can still miss numbers (a cut-off trace): say which and why.
            "reason": run_reason(r.error) or "; ".join(r.warnings),
        }
        for r in doc.runs
    ]
    rows += [{"run_id": Path(s.path).name, "status": "unreadable", "reason": s.reason}
             for s in doc.skipped]  # fmt: skip
    # broke the run-folder contract: never analysed
    rows += [{"run_id": Path(s.path).name, "status": "invalid", "reason": s.reason}
             for s in doc.invalid]  # fmt: skip
    return rows


def _row(entry: Any) -> dict[str, Any]:
    return msgspec.structs.asdict(entry)


def env_rows(doc: RunsJson) -> list[dict[str, Any]]:
    rows = [{c.key: getattr(run, c.key) for c in ENV_COLS} for run in doc.runs]
    # Platform first, then backend: Linux vs Windows and NCCL vs GLOO end up next to each other.
    return sorted(rows, key=lambda r: (str(r["os"]), str(r["backend"]), str(r["run_id"])))


def trace_link_rows(doc: RunsJson, out_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for run in doc.runs:
        folder = Path(run.path)
        rows.append(
            {
                "run_id": run.run_id,
                "status": run.status,
                "kind": run.trace["kind"] if run.trace and "kind" in run.trace else None,
                "trace_links": [_link(folder / t, out_dir) for t in run.trace_files],
                "log_links": [_link(folder / p, out_dir) for p in run.logs],
            }
        )
    return rows


def headline_table_rows(doc: RunsJson) -> list[dict[str, Any]]:
    """The headline table (analysis.runs.sweep.headline_rows), one row per group of seeds."""
    return [
        {
            "group": group_label(h.group),
            **{k: getattr(h.group, k) for k in _HEADLINE_GROUP_KEYS},
            "mode": h.group.strategy or h.group.mode,  # the family member
            "batch": h.batch,
            "epoch_time_s": h.epoch_time_s,
            "peak_memory_bytes": h.peak_memory_bytes,
        }
        for h in headline_rows(doc)
    ]


_HEADLINE_GROUP_KEYS = (
    tuple(
        c.key for c in HEADLINE_COLS if c.key not in ("batch", "epoch_time_s", "peak_memory_bytes")
    )
    + tuple(c.std_key for c in HEADLINE_COLS if c.std_key)
    + tuple(k for c in HEADLINE_COLS for k in c.ci_keys or ())
)


# The median [95% CI] over the rounds is the group's figure (issue 33); the mean ± std over its
# runs shows only where a group has no median, and stays in the CSV.
ROUND_STAND_INS = {
    "speedup_mean": "speedup_median",
    "scaling_efficiency_mean": "scaling_efficiency_median",
}


def all_tables(doc: RunsJson, out_dir: Path, labels: Labels) -> dict[str, Table]:
    """Every report table keyed by id (`labels`: run_id -> the report's one label of each run);
    CSV names are the ones the report promises."""
    coll, overlap, strag = trace_rows(doc)
    groups = [_row(g) for g in doc.groups]
    return {
        "summary": Table(
            id="summary",
            columns=SUMMARY_COLS,
            rows=summary_rows(doc, labels),
            csv="summary.csv",
            # The Run column shows the label (OS included when runs differ by it; full id: tooltip).
            # The page's summary fits 1,400 px: quiet_steps is shown beside the quiet throughput
            # ("812.4 (12 steps)"), the baseline's noise in the speedup table and top-1 in the
            # accuracy table (per group); the CSV keeps each run's.
            csv_only=frozenset({"label", "os", "quiet_steps", "baseline_noise_pct", "top1_pct"}),
        ),
        "phases": Table(
            id="phases",
            columns=PHASE_COLS,
            rows=[_row(p) for p in phase_rows(doc)],
            csv="phases.csv",
        ),
        "collectives": Table(
            id="collectives", columns=COLLECTIVE_COLS, rows=coll, csv="collectives.csv"
        ),
        "overlap": Table(id="overlap", columns=OVERLAP_COLS, rows=overlap, csv="overlap.csv"),
        "stragglers": Table(
            id="stragglers", columns=STRAGGLER_COLS, rows=strag, csv="stragglers.csv"
        ),
        "memory": Table(id="memory", columns=MEMORY_COLS, rows=memory_rows(doc), csv="memory.csv"),
        "speedup": Table(
            id="speedup",
            columns=SPEEDUP_COLS,
            rows=groups,
            csv="speedup.csv",
            unless_shown=ROUND_STAND_INS,
        ),
        "accuracy": Table(id="accuracy", columns=ACCURACY_COLS, rows=groups, csv="accuracy.csv"),
        "environment": Table(
            id="environment", columns=ENV_COLS, rows=env_rows(doc), csv="environment.csv"
        ),
        "traces": Table(id="traces", columns=TRACE_COLS, rows=trace_link_rows(doc, out_dir)),
        "headline": Table(
            id="headline",
            columns=HEADLINE_COLS,
            rows=headline_table_rows(doc),
            csv="headline.csv",
            only_if_varied=frozenset({"os"}),
            unless_shown=ROUND_STAND_INS,
        ),
    }
