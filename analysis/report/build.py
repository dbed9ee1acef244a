"""Build the report folder: index.html (self-contained), summary.json and the CSV tables.

`build_report` runs `compare_runs` over the given folders; `write_report` turns its runs JSON into
files. All HTML goes through Jinja2 with autoescape on, so every string from a trace or run.json
(op names, hostnames, error messages) lands as text; only our own figure URIs are trusted.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from tqdm import tqdm

from analysis.report import figures
from analysis.report.findings import THRESHOLDS, findings
from analysis.report.ops import ops_context
from analysis.report.projection import projection_context
from analysis.report.tables import Table, all_tables, fmt, unique_labels
from analysis.report.tune import tune_sections
from analysis.runs import WORKLOAD_KEY

__all__ = ["ReportError", "ReportFiles", "build_report", "write_report"]

TEMPLATES = Path(__file__).parent / "templates"


class ReportError(Exception):
    """A one-line, user-facing problem (bad folder, unwritable output); the CLI prints it."""


@dataclass(frozen=True, kw_only=True)
class ReportFiles:
    """What a report build wrote."""

    index_html: Path
    summary_json: Path
    csvs: list[Path] = field(default_factory=list)


def _write_atomic(path: Path, text: str) -> None:
    # Temp file in the same folder + os.replace: a reader never sees half a report.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    return obj


def _runs_frame(data: dict[str, Any]) -> pd.DataFrame:
    """One row per ok run with the fields the figures need, plus a label and a series name."""
    runs = [r for r in data.get("runs", []) if r.get("status") == "ok"]
    labels = unique_labels(runs)
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
    backend = df["backend"].where(~df["backend"].isin(["none", "dp"]) & df["backend"].notna(), "")
    df["series"] = df["mode"].astype(str) + backend.map(lambda b: f" ({b})" if b else "")
    # One line per comparable set: never average a model's throughput with another model's.
    for col in WORKLOAD_KEY:
        if df[col].nunique() > 1:
            df["series"] += " · " + df[col].astype(str)
    for col in ("samples_per_s", "speedup", "top1_pct", "test_loss", "world_size"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def _bar(frame: pd.DataFrame, labels: dict[str, str], *extra: str) -> pd.DataFrame:
    """Add a `bar` column (run label · rank · ...) used as the y axis of per-rank figures."""
    if frame.empty:
        return frame.assign(bar=pd.Series(dtype=str))
    bar = frame["run_id"].map(labels).fillna(frame["run_id"])
    for col in extra:
        bar = bar + " · " + frame[col].map(lambda v, c=col: f"{c} {v}" if c == "rank" else str(v))
    return frame.assign(bar=bar)


def _figures(
    data: dict[str, Any], tables: dict[str, Table], progress: bool
) -> dict[str, str | None]:
    labels = unique_labels(data.get("runs", []))
    runs = _runs_frame(data)
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
    jobs = {
        "summary": lambda: figures.summary_figure(runs),
        "speedup": lambda: figures.speedup_figure(runs),
        "phases": lambda: figures.phases_figure(_bar(tables["phases"].frame(), labels, "rank")),
        "comm": lambda: figures.comm_figure(
            _bar(tables["overlap"].frame(), labels, "rank"),
            _bar(tables["collectives"].frame(), labels, "name"),
        ),
        "memory": lambda: figures.memory_figure(
            _bar(tables["memory"].frame(), labels, "rank", "device")
        ),
        "accuracy": lambda: figures.accuracy_figure(runs),
        "environment": lambda: figures.environment_figure(runs),
        "traces": lambda: figures.step_times_figure(_bar(steps, labels, "rank")),
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


def write_report(data: dict[str, Any], out_dir: Path, *, progress: bool = True) -> ReportFiles:
    """Write index.html, summary.json and the CSV tables for a runs JSON into `out_dir`."""
    out_dir = Path(out_dir)
    tables = all_tables(data, out_dir)
    found = findings(data)
    figs = _figures(data, tables, progress)
    summary = _json_safe(
        {**data, "findings": [f.to_dict() for f in found], "thresholds": THRESHOLDS}
    )
    html = (
        _environment()
        .get_template("index.html.j2")
        .render(
            data=data,
            tables=tables,
            labels=unique_labels(data.get("runs", [])),
            findings=found,
            figures=figs,
            ops=ops_context(data),
            projection=projection_context(data),
            thresholds=THRESHOLDS,
            tunes=tune_sections(data),
            n_runs=len(data.get("runs", [])) + len(data.get("skipped", [])),
            generated_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        )
    )
    # Everything is rendered before the first write, so a failure above leaves the folder as it was.
    files = {t.csv: t.frame().to_csv(index=False) for t in tables.values() if t.csv}
    files["summary.json"] = json.dumps(summary, indent=2, allow_nan=False) + "\n"
    files["index.html"] = html  # last: its appearance means the report is complete
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            _write_atomic(out_dir / name, text)
    except OSError as exc:
        raise ReportError(
            f"cannot write the report into {out_dir}: {exc.strerror or exc}; pass another --out"
        ) from exc
    index = out_dir / "index.html"
    csvs = [out_dir / t.csv for t in tables.values() if t.csv]
    return ReportFiles(index_html=index, summary_json=out_dir / "summary.json", csvs=csvs)


def build_report(paths: Sequence[Path], out_dir: Path, *, progress: bool = True) -> ReportFiles:
    """Analyse the run folders under `paths` with `compare_runs` and write the report."""
    from analysis.runs import AnalysisError, compare_runs

    for p in paths:
        if not Path(p).is_dir():
            raise ReportError(f"{p} is not a folder; pass RUNS folders made by `make profile-all`")
    try:
        data = compare_runs([Path(p) for p in paths], progress=progress)
    except AnalysisError as exc:
        raise ReportError(str(exc)) from exc
    return write_report(data, out_dir, progress=progress)
