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

from analysis.jsonsafe import DISPLAY_CHARS, OWN_LINE_CHARS, clip
from analysis.outputs import check_report_out
from analysis.parquet import runs_json_tables, table_bytes
from analysis.progress import Bar
from analysis.report import family_section, figures, memory_section
from analysis.report.findings import THRESHOLDS, findings
from analysis.report.labels import Labels, unique_labels
from analysis.report.loss import loss_context
from analysis.report.ops import ops_context
from analysis.report.outfolder import ReportError, replace_folder
from analysis.report.projection import projection_context
from analysis.report.scaling import (
    GROUP_FIGURES_ABOVE,
    MAX_CHIPS,
    MAX_FINDINGS,
    group_labels,
    scaling_figures,
    scaling_frame,
)
from analysis.report.tables import Table, all_tables, fmt
from analysis.report.tune import tune_sections
from analysis.report.verdict import verdict
from analysis.runs.compare import compare_runs
from analysis.runs.groups import WORKLOAD_KEY
from analysis.runs.rows import step_points
from analysis.runs.runsjson import RunsJson, RunsJsonError, read_runs_json
from analysis.runs.sweep import first_of_groups, skipped_by_reason
from profiler.runfolder.errors import InputError
from profiler.runfolder.hostload import QUIET_OTHER_CORES_FRAC

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


# dpscope's own one-line reasons ("<file>: <what is wrong> — <what to do>"): at DISPLAY_CHARS a
# long path ate the what and the fix (a skipped projection read "… not a real step tim…").
_LINE_KEYS = frozenset({"reason"})


def _display(obj: Any, limit: int = DISPLAY_CHARS, keep: frozenset = _PATH_KEYS) -> Any:
    """A copy of the runs JSON with long strings clipped for display (summary.json keeps all);
    values under the `keep` keys are left as they are, those under _LINE_KEYS clipped at
    OWN_LINE_CHARS."""
    if isinstance(obj, str):
        return clip(obj, limit)
    if isinstance(obj, dict):
        return {
            k: v if k in keep else _display(v, OWN_LINE_CHARS if k in _LINE_KEYS else limit, keep)
            for k, v in obj.items()
        }
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


def runs_frame(doc: RunsJson | dict[str, Any], labels: Labels) -> pd.DataFrame:
    """One row per measured run with the fields the figures need, plus its label and a series name."""
    doc = read_runs_json(doc)
    keys = ["run_id", *WORKLOAD_KEY, "mode", "strategy", "backend", "world_size", "seed",
            "samples_per_s", "speedup", "top1_pct", "test_loss"]  # fmt: skip
    df = pd.DataFrame([{k: getattr(r, k) for k in keys} for r in doc.measured()], columns=keys)
    df["label"] = df["run_id"].map(labels)
    group_of = group_labels(doc)
    df["group"] = [group_of[r] if r in group_of else lab
                   for r, lab in zip(df["run_id"], df["label"], strict=True)]  # fmt: skip
    backend = df["backend"].where(~df["backend"].isin(["none", "dp"]) & df["backend"].notna(), "")
    member = df["strategy"].fillna(df["mode"]).astype(str)
    df["series"] = member + backend.map(lambda b: f" ({b})" if b else "")
    # One line per comparable set: never average a model's throughput with another model's.
    for col in WORKLOAD_KEY:
        if df[col].nunique() > 1:
            df["series"] += " · " + df[col].astype(str)
    for col in ("samples_per_s", "speedup", "top1_pct", "test_loss", "world_size"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def _pooled_bar(
    frame: pd.DataFrame, labels: Labels, *extra: str, pooled: bool = False
) -> pd.DataFrame:
    """Add a `bar` column (run label · rank · ...) used as the y axis of per-rank figures.

    `pooled`: `labels` map runs to their group, and rows sharing a bar (the seeds of a group)
    are drawn as one bar holding their mean, so a sweep draws one bar per group and rank.
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
    data: dict[str, Any], tables: dict[str, Table], labels: Labels, progress: bool
) -> dict[str, str | None]:
    # Run ids stay as in the tables (already clipped there): they key the labels of every figure.
    doc = read_runs_json(
        _display(data, FIGURE_CHARS, _PATH_KEYS | {"run_id", "run_ids", "baseline_run_id"})
    )
    runs = runs_frame(doc, labels)
    steps = pd.DataFrame(step_points(doc), columns=["run_id", "rank", "step", "step_time_ms"])
    by_group = len(runs) > GROUP_FIGURES_ABOVE
    if by_group:  # per-rank figures: one bar per group of seeds (mean), not one per run
        labels = Labels(zip(runs["run_id"], runs["group"], strict=True))

    def bar_of(frame: pd.DataFrame, labels: Labels, *extra: str) -> pd.DataFrame:
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
        for name, job in Bar(jobs.items(), desc="figures", disable=not progress, leave=False)
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


def _read(data: dict[str, Any]) -> RunsJson:
    try:
        return read_runs_json(data)
    except RunsJsonError as exc:
        raise ReportError(str(exc)) from None


def _files(
    tables: dict, full: dict[str, Any], summary: dict, html: str
) -> tuple[dict[str, str | bytes], list[str]]:
    """Every file of the report folder by name (the CSV tables, the runs' Parquet tables,
    summary.json, index.html), and the Parquet files' names."""
    files: dict[str, str | bytes] = {
        t.csv: t.frame().to_csv(index=False) for t in tables.values() if t.csv
    }
    columnar = {f"{n}.parquet": table_bytes(t) for n, t in runs_json_tables(full).items()}
    files.update(columnar)
    files["summary.json"] = json.dumps(summary, indent=2, allow_nan=False) + "\n"
    files["index.html"] = html
    return files, list(columnar)


def _labels(shown: dict[str, Any]) -> Labels:
    """Labels are made once, over every run, from strings clipped for a figure's axis (run ids as
    in the tables): a figure and a table cannot name a run differently."""
    runs = shown["runs"] if "runs" in shown else []
    return unique_labels(
        _read({"runs": _display(runs, FIGURE_CHARS, _PATH_KEYS | {"run_id"})}).runs
    )


def write_report(data: dict[str, Any], out_dir: Path, *, progress: bool = True) -> ReportFiles:
    """Write index.html, summary.json and the CSV tables for a runs JSON into `out_dir`."""
    out_dir = Path(out_dir)
    full, shown = data, _display(data)
    doc = _read(shown)
    _check_out(out_dir, [Path(r.path) for r in doc.runs if r.path])
    labels = _labels(shown)
    tables = all_tables(doc, out_dir, labels)
    many = len(doc.measured()) > GROUP_FIGURES_ABOVE
    firsts = first_of_groups(doc) if many else None
    memory = memory_section.context(doc, labels, firsts)
    tables["memory_breakdown"] = memory["table"]
    found = findings(doc) + memory["findings"]
    loss = loss_context(doc)
    tables["efficiency_loss"] = loss["table"]
    tables.update(family_section.context(doc))
    figs = _figures(shown, tables, labels, progress)
    summary = _json_safe(
        {**full, "findings": [f.to_dict() for f in found], "thresholds": THRESHOLDS}
    )
    # Tune commands and notes are dpscope's own long lines: a looser clip keeps them whole.
    tunes = _read({"tunes": _display(full["tunes"], OWN_LINE_CHARS)} if "tunes" in full else {})
    html = (
        _environment()
        .get_template("index.html.j2")
        .render(
            data=doc,
            tables=tables,
            labels=labels,
            findings=found,
            verdict=verdict(doc),
            loss=loss,
            figures=figs,
            scaling_figures=scaling_figures(scaling_frame(doc)),
            skipped_reasons=skipped_by_reason(doc),
            many_runs=many,
            max_chips=MAX_CHIPS,
            max_findings=MAX_FINDINGS,
            ops=ops_context(firsts if firsts is not None else doc, labels),
            projection=projection_context(doc),
            memory_breakdown=memory,
            thresholds=THRESHOLDS,
            tunes=tune_sections(tunes.tunes),
            n_runs=len(doc.runs) + len(doc.skipped) + len(doc.invalid),
            generated_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        )
    )
    # Everything is rendered before the first write, so a failure above leaves the folder as it was.
    files, columnar = _files(tables, full, summary, html)
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
    paths: Sequence[Path],
    out_dir: Path,
    *,
    progress: bool = True,
    clock_align: str = "auto",
    memory_budget_bytes: int | None = None,
    quiet_frac: float = QUIET_OTHER_CORES_FRAC,
) -> ReportFiles:
    """Analyse the run folders under `paths` with `compare_runs` (trace clocks aligned per
    `clock_align`; `quiet_frac`: its quiet-step threshold) and write the report
    (`memory_budget_bytes`: the per-rank memory the family's capacity fits models into)."""
    for p in paths:
        if not Path(p).is_dir():
            raise ReportError(f"{p} is not a folder; pass RUNS folders made by `make profile-all`")
    _check_out(Path(out_dir), [Path(p) for p in paths])  # before any work
    try:
        data = compare_runs(
            [Path(p) for p in paths],
            progress=progress,
            clock_align=clock_align,
            memory_budget_bytes=memory_budget_bytes,
            quiet_frac=quiet_frac,
        )
    except InputError as exc:
        raise ReportError(str(exc)) from exc
    return write_report(data, out_dir, progress=progress)
