"""Build the report folder: index.html (self-contained), summary.json, the CSV tables and the
Parquet tables (analysis/parquet.py: steps, collectives, ops, memory).

`build_report` runs `compare_runs` over the given folders; `write_report` turns its runs JSON into
files. All HTML goes through Jinja2 with autoescape on, so every string from a trace or run.json
(op names, hostnames, error messages) lands as text; only our own figure URIs are trusted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from tqdm import tqdm

from analysis.jsonsafe import DISPLAY_CHARS, clip
from analysis.outputs import check_report_out
from analysis.parquet import run_tables, table_bytes
from analysis.report import figures, memory_section
from analysis.report.findings import THRESHOLDS, findings
from analysis.report.loss import loss_context
from analysis.report.ops import ops_context
from analysis.report.outfolder import ReportError, replace_folder
from analysis.report.projection import projection_context
from analysis.report.scaling import (
    GROUP_FIGURES_ABOVE,
    MAX_CHIPS,
    MAX_FINDINGS,
    first_of_groups,
    group_labels,
    scaling_figures,
    scaling_frame,
    skipped_by_reason,
)
from analysis.report.tables import Table, all_tables, fmt, unique_labels
from analysis.report.tune import tune_sections
from analysis.report.verdict import verdict
from analysis.runs.compare import WORKLOAD_KEY, compare_runs, is_measured
from profiler.runfolder.errors import InputError

__all__ = ["ReportError", "ReportFiles", "build_report", "write_report"]

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True, kw_only=True)
class ReportFiles:
    """What a report build wrote."""

    index_html: Path
    summary_json: Path
    csvs: list[Path] = field(default_factory=list)
    parquet: list[Path] = field(default_factory=list)  # steps/collectives/ops/memory tables


# Keys whose strings are file paths (links must stay whole); every other string from a record is
# cut to DISPLAY_CHARS for the page, so the report's time does not grow with a string's length.
_PATH_KEYS = frozenset({"path", "file", "trace_files", "trace_dir"})
FIGURE_CHARS = 40  # figure labels: a longer one squeezes the plot out of its canvas


def _display(obj: Any, limit: int = DISPLAY_CHARS, keep: frozenset = _PATH_KEYS) -> Any:
    """A copy of the runs JSON with long strings clipped for display (summary.json keeps all);
    values under the `keep` keys are left as they are."""
    if isinstance(obj, str):
        return clip(obj, limit)
    if isinstance(obj, dict):
        return {k: v if k in keep else _display(v, limit, keep) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_display(v, limit, keep) for v in obj]
    return obj


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    return obj


def runs_frame(data: dict[str, Any], labels: dict[str, str]) -> pd.DataFrame:
    """One row per ok run with the fields the figures need, plus its label and a series name."""
    runs = [r for r in data.get("runs", []) if is_measured(r)]
    keys = [
        "run_id",
        *WORKLOAD_KEY,
        "mode",
        "backend",
        "world_size",
        "seed",
        "samples_per_s",
        "speedup",
        "top1_pct",
        "test_loss",
    ]
    df = pd.DataFrame([{k: r.get(k) for k in keys} for r in runs], columns=keys)
    df["label"] = df["run_id"].map(labels)
    group_of = group_labels(data)
    df["group"] = [group_of.get(r, lab) for r, lab in zip(df["run_id"], df["label"], strict=True)]
    backend = df["backend"].where(~df["backend"].isin(["none", "dp"]) & df["backend"].notna(), "")
    df["series"] = df["mode"].astype(str) + backend.map(lambda b: f" ({b})" if b else "")
    # One line per comparable set: never average a model's throughput with another model's.
    for col in WORKLOAD_KEY:
        if df[col].nunique() > 1:
            df["series"] += " · " + df[col].astype(str)
    for col in ("samples_per_s", "speedup", "top1_pct", "test_loss", "world_size"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def _pooled_bar(
    frame: pd.DataFrame, labels: dict[str, str], *extra: str, pooled: bool = False
) -> pd.DataFrame:
    """Add a `bar` column (run label · rank · ...) used as the y axis of per-rank figures.

    `pooled`: `labels` map runs to their group, and rows sharing a bar (the seeds of a group)
    become one row holding their mean, so a sweep draws one bar per group and rank, not per run.
    """
    if frame.empty:
        return frame.assign(bar=pd.Series(dtype=str))
    bar = frame["run_id"].map(labels).fillna(frame["run_id"])
    for col in extra:
        bar = bar + " · " + frame[col].map(lambda v, c=col: f"{c} {v}" if c == "rank" else str(v))
    frame = frame.assign(bar=bar.map(lambda b: clip(b, 2 * FIGURE_CHARS)))
    if not pooled:
        return frame
    keys = ["bar", *(["step"] if "step" in frame else [])]
    # Numeric columns, including all-empty ones (CUDA memory on CPU runs) the figures still name.
    nums = {c: pd.to_numeric(frame[c], errors="coerce") for c in frame if c not in keys}
    nums = {c: v for c, v in nums.items() if v.notna().sum() == frame[c].notna().sum()}
    return frame[keys].assign(**nums).groupby(keys, sort=False).mean().reset_index()


def _figures(
    data: dict[str, Any], tables: dict[str, Table], labels: dict[str, str], progress: bool
) -> dict[str, str | None]:
    # Run ids stay as in the tables (already clipped there): they key the labels of every figure.
    data = _display(data, FIGURE_CHARS, _PATH_KEYS | {"run_id", "run_ids", "baseline_run_id"})
    runs = runs_frame(data, labels)
    steps = pd.DataFrame(
        [
            {
                "run_id": r["run_id"],
                "rank": rk["rank"],
                "step": s["step"],
                "step_time_ms": s["step_time_us"] / 1e3,
            }
            for r in data.get("runs", [])
            for rk in (r.get("trace") or {}).get("ranks") or []
            for s in rk.get("per_step") or []
            if s.get("step_time_us") is not None
        ],
        columns=["run_id", "rank", "step", "step_time_ms"],
    )
    by_group = len(runs) > GROUP_FIGURES_ABOVE
    if by_group:  # per-rank figures: one bar per group of seeds (mean), not one per run
        labels = dict(zip(runs["run_id"], runs["group"], strict=True))

    def bar_of(frame: pd.DataFrame, labels: dict[str, str], *extra: str) -> pd.DataFrame:
        return _pooled_bar(frame, labels, *extra, pooled=by_group)

    jobs = {
        "summary": lambda: figures.summary_figure(runs, by_group=by_group),
        "speedup": lambda: figures.speedup_figure(runs),
        "phases": lambda: figures.phases_figure(bar_of(tables["phases"].frame(), labels, "rank")),
        "comm": lambda: figures.comm_figure(
            bar_of(tables["overlap"].frame(), labels, "rank"),
            bar_of(tables["collectives"].frame(), labels, "name"),
        ),
        "memory": lambda: figures.memory_figure(
            bar_of(tables["memory"].frame(), labels, "rank", "device")
        ),
        "accuracy": lambda: figures.accuracy_figure(runs),
        "environment": lambda: figures.environment_figure(runs),
        "traces": lambda: figures.step_times_figure(bar_of(steps, labels, "rank")),
    }
    return {
        name: job()
        for name, job in tqdm(jobs.items(), desc="figures", disable=not progress, leave=False)
    }


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,  # every template, whatever its file name: data is never trusted
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["fmt"] = fmt
    return env


def _check_out(out_dir: Path, inputs: list[Path]) -> None:
    try:
        check_report_out(out_dir, inputs)
    except InputError as exc:
        raise ReportError(str(exc)) from None


def write_report(data: dict[str, Any], out_dir: Path, *, progress: bool = True) -> ReportFiles:
    """Write index.html, summary.json and the CSV tables for a runs JSON into `out_dir`."""
    out_dir = Path(out_dir)
    _check_out(out_dir, [Path(r["path"]) for r in data.get("runs", []) if r.get("path")])
    full, data = data, _display(data)
    # Labels are made once, over every run, from strings clipped for a figure's axis (run ids as in
    # the tables): a figure and a table cannot name a run differently.
    labels = unique_labels(_display(data.get("runs", []), FIGURE_CHARS, _PATH_KEYS | {"run_id"}))
    tables = all_tables(data, out_dir, labels)
    many = sum(is_measured(r) for r in data.get("runs", [])) > GROUP_FIGURES_ABOVE
    memory = memory_section.context(data, labels, first_of_groups(data) if many else None)
    tables["memory_breakdown"] = memory["table"]
    found = findings(data) + memory["findings"]
    loss = loss_context(data)
    tables["efficiency_loss"] = loss["table"]
    figs = _figures(data, tables, labels, progress)
    summary = _json_safe(
        {**full, "findings": [f.to_dict() for f in found], "thresholds": THRESHOLDS}
    )
    html = (
        _environment()
        .get_template("index.html.j2")
        .render(
            data=data,
            tables=tables,
            labels=labels,
            findings=found,
            verdict=verdict(data),
            loss=loss,
            figures=figs,
            scaling_figures=scaling_figures(scaling_frame(data)),
            skipped_reasons=skipped_by_reason(data),
            many_runs=many,
            max_chips=MAX_CHIPS,
            max_findings=MAX_FINDINGS,
            ops=ops_context(first_of_groups(data) if many else data, labels),
            projection=projection_context(data),
            memory_breakdown=memory,
            thresholds=THRESHOLDS,
            # Tune commands and notes are dpscope's own long lines: a looser clip keeps them whole.
            tunes=tune_sections({"tunes": _display(full.get("tunes") or [], 10 * DISPLAY_CHARS)}),
            n_runs=len(data.get("runs", []))
            + len(data.get("skipped", []))
            + len(data.get("invalid", [])),
            generated_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        )
    )
    # Everything is rendered before the first write, so a failure above leaves the folder as it was.
    files: dict[str, str | bytes] = {
        t.csv: t.frame().to_csv(index=False) for t in tables.values() if t.csv
    }
    runs = [(r["run_id"], r.get("trace")) for r in full.get("runs", []) if r.get("run_id")]
    columnar = {f"{n}.parquet": table_bytes(t) for n, t in run_tables(runs).items()}
    files.update(columnar)
    files["summary.json"] = json.dumps(summary, indent=2, allow_nan=False) + "\n"
    files["index.html"] = html
    replace_folder(files, out_dir)
    index = out_dir / "index.html"
    csvs = [out_dir / t.csv for t in tables.values() if t.csv]
    return ReportFiles(
        index_html=index,
        summary_json=out_dir / "summary.json",
        csvs=csvs,
        parquet=[out_dir / n for n in columnar],
    )


def build_report(
    paths: Sequence[Path], out_dir: Path, *, progress: bool = True, clock_align: str = "auto"
) -> ReportFiles:
    """Analyse the run folders under `paths` with `compare_runs` (trace clocks aligned per
    `clock_align`) and write the report."""
    for p in paths:
        if not Path(p).is_dir():
            raise ReportError(f"{p} is not a folder; pass RUNS folders made by `make profile-all`")
    _check_out(Path(out_dir), [Path(p) for p in paths])  # before any work
    try:
        data = compare_runs([Path(p) for p in paths], progress=progress, clock_align=clock_align)
    except InputError as exc:
        raise ReportError(str(exc)) from exc
    return write_report(data, out_dir, progress=progress)
