"""Shared cases of the hostile-input tests (tests/test_hostile*.py): run.json / steps.csv edits
of the session's real runs, trace edits of the real DDP run's rank-1 trace, and the module
fixtures over that run's traces (`ddp_traces`, `clean_ranks`: import them into a test module)."""

from __future__ import annotations

import csv
import gzip
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from analysis.trace.folder import analyze_trace_dir
from tests.conftest import REPO, read_run

DEEP = 100_000  # levels of nesting: far past any recursion limit


def strict_json(text: str) -> dict:
    """json.loads that refuses NaN/Infinity, as browsers' JSON.parse and jq do."""

    def refuse(token: str):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        **kw,
    )


# ---------------------------------------------------------------------------------------------
# Run folders: run.json and steps.csv validated at the boundary
# ---------------------------------------------------------------------------------------------


def _set(path: str, value) -> Callable[[dict], None]:
    """An edit of run.json: set the dotted `path` to `value`."""

    def edit(rec: dict) -> None:
        *parents, last = path.split(".")
        node = rec
        for key in parents:
            node = node[key]
        node[last] = value

    return edit


def _steps_cell(column: str, value: str) -> Callable[[Path], None]:
    """An edit of steps.csv: put `value` into `column` of the third data row."""

    def edit(path: Path) -> None:
        rows = list(csv.DictReader(path.open()))
        rows[2][column] = value
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)

    return edit


def _steps_extra_cell(path: Path) -> None:
    lines = path.read_text().splitlines()
    lines[3] += ",7"
    path.write_text("\n".join(lines) + "\n")


def _failed_with_string_error(rec: dict) -> None:
    rec.update(status="failed", error="rank 1 died", metrics={})


def _memory_rank_true(rec: dict) -> None:
    rec["metrics"]["memory"][0]["rank"] = True


def _dp_devices_string(rec: dict) -> None:
    rec["config"].update(mode="dp", backend="none", devices="cpu")


def _nested(levels: int) -> dict:
    node: dict = {"rank": 0}
    for _ in range(levels):
        node = {"x": node}
    return {"rank": 0, "deep": node}


def _memory_entries(n: int) -> Callable[[dict], None]:
    def edit(rec: dict) -> None:
        rec["metrics"]["memory"] = [dict(rec["metrics"]["memory"][0], rank=i) for i in range(n)]

    return edit


def _steps_duplicate_row(path: Path) -> None:
    lines = path.read_text().splitlines()
    lines.insert(5, lines[2])  # line 3's row again as line 6
    path.write_text("\n".join(lines) + "\n")


def _steps_duplicate_column(path: Path) -> None:
    lines = path.read_text().splitlines()
    lines = [f"{ln},{ln.split(',')[5]}" for ln in lines]  # step_time_s once more at the end
    path.write_text("\n".join(lines) + "\n")


def _steps_many_ranks(n: int) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        header, row = path.read_text().splitlines()[:2]
        rest = row.split(",", 1)[1]
        path.write_text("\n".join([header, *(f"{r},{rest}" for r in range(n))]) + "\n")

    return edit


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


# name -> (base run, run.json edit, steps.csv edit, field named in the line)
RUN_CASES = {
    "metrics-list": ("ddp", _set("metrics", []), None, "`metrics`"),
    "env-list": ("ddp", _set("env", ["Linux"]), None, "`env`"),
    "error-string": ("ddp", _failed_with_string_error, None, "`error`"),
    "run-id-list": ("ddp", _set("run_id", ["a", "b"]), None, "`run_id`"),
    "mode-list": ("ddp", _set("config.mode", ["ddp"]), None, "`config.mode`"),
    "world-size-abc": ("ddp", _set("config.world_size", "abc"), None, "`config.world_size`"),
    "world-size-list": ("ddp", _set("config.world_size", [2]), None, "`config.world_size`"),
    "world-size-negative": ("ddp", _set("config.world_size", -2), None, "`config.world_size`"),
    "samples-per-s-string": (
        "ddp",
        _set("metrics.samples_per_s", "fast"),
        None,
        "`metrics.samples_per_s`",
    ),
    "memory-non-objects": ("ddp", _set("metrics.memory", [1, "x"]), None, "`metrics.memory[0]`"),
    "traces-int": ("ddp", _set("traces", 5), None, "`traces`"),
    "eval-best-list": ("ddp", _set("eval.best", [1]), None, "`eval.best`"),
    "step-time-int": ("ddp", _set("metrics.step_time_s", 5), None, "`metrics.step_time_s`"),
    "rank-true": ("ddp", _memory_rank_true, None, "`metrics.memory[0].rank`"),
    "baseline-negative": (
        "single",
        _set("metrics.samples_per_s", -5),
        None,
        "`metrics.samples_per_s`",
    ),
    "dp-devices-string": ("ddp", _dp_devices_string, None, "`config.devices`"),
    "schema-99": ("ddp", _set("schema_version", 99), None, "`schema_version`"),
    "status-unknown": ("ddp", _set("status", "great"), None, "`status`"),
    "steps-text-cell": ("ddp", None, _steps_cell("step_time_s", "abc"), "`step_time_s, line 4`"),
    "steps-warmup-text": ("ddp", None, _steps_cell("warmup", "yes"), "`warmup, line 4`"),
    "steps-inf": ("ddp", None, _steps_cell("data_s", "inf"), "`data_s, line 4`"),
    "steps-extra-cell": ("ddp", None, _steps_extra_cell, "`line 4`: more cells"),
    # schema 2 (issue 8) fields: typed too
    "warnings-string": ("ddp", _set("warnings", "slow"), None, "`warnings`"),
    "overhead-string": (
        "ddp",
        _set("metrics.profiler_overhead_pct", "high"),
        None,
        "`metrics.profiler_overhead_pct`",
    ),
    "overhead-below-minus-100": (
        "ddp",
        _set("metrics.profiler_overhead_pct", -150.0),
        None,
        "`metrics.profiler_overhead_pct`",
    ),
    "steps-profiled-2": ("ddp", None, _steps_cell("profiled", "2"), "`profiled, line 4`"),
    # issue 25 B.1: the sub-records the projection reads are typed too
    "metrics-ddp-string": ("ddp", _set("metrics.ddp", "buckets"), None, "`metrics.ddp`"),
    "metrics-ddp-buckets-text": (
        "ddp",
        _set("metrics.ddp", {"bucket_sizes_bytes": ["x"]}),
        None,
        "`metrics.ddp.bucket_sizes_bytes[0]`",
    ),
    "config-ddp-list": ("ddp", _set("config.ddp", [25]), None, "`config.ddp`"),
    "config-ddp-cap-zero": ("ddp", _set("config.ddp.bucket_cap_mb", 0), None, "bucket_cap_mb"),
    "config-profile-list": ("ddp", _set("config.profile", []), None, "`config.profile`"),
    "config-profile-wait-text": ("ddp", _set("config.profile.wait", "1"), None, "profile.wait"),
    "memory-deep": ("ddp", _set("metrics.memory", [_nested(500)]), None, "nested too deeply"),
    "duplicate-key": ("ddp", None, None, "`run_id`: key `run_id` given twice"),
    # issue 25 B.3 / B.6: run-folder numbers that would be silently wrong or unbounded
    "param-grad-negative": (
        "ddp",
        _set("metrics.param_grad_bytes", [4096, -5]),
        None,
        "`metrics.param_grad_bytes[1]`",
    ),
    "memory-50000-entries": ("ddp", _memory_entries(50_000), None, "`metrics.memory`"),
    "breakdown-50000-entries": (
        "ddp",
        _set("metrics.memory_breakdown", [{}] * 50_000),
        None,
        "`metrics.memory_breakdown`",
    ),
    "steps-duplicate-row": ("ddp", None, _steps_duplicate_row, "`rank, step, line 6`"),
    "steps-duplicate-column": ("ddp", None, _steps_duplicate_column, "column given twice"),
    "steps-rank-beyond-world": ("ddp", None, _steps_cell("rank", "7"), "`rank, line 4`"),
    "steps-20000-ranks": ("ddp", None, _steps_many_ranks(20_000), "beyond run.json"),
    "steps-huge-cell": ("ddp", None, _steps_cell("loss", "9" * 200_000), "`loss, line 4`"),
    "steps-fifo": ("ddp", None, _fifo, "FIFO"),
    "steps-folder": ("ddp", None, _folder, "a folder"),
}


def make_bad_runs(root: Path, single: Path, ddp: Path) -> None:
    """Good runs (full copies, traces included) plus one folder per bad case (no traces)."""
    shutil.copytree(single, root / "good-single")
    shutil.copytree(ddp, root / "good-ddp")
    bases = {"single": single, "ddp": ddp}
    for name, (base, edit_json, edit_steps, _) in RUN_CASES.items():
        dst = root / name
        dst.mkdir()
        shutil.copy(bases[base] / "steps.csv", dst / "steps.csv")
        rec = read_run(bases[base])
        rec.update(run_id=name, traces=[])
        if edit_json:
            edit_json(rec)
        text = json.dumps(rec)
        if name == "duplicate-key":  # `"run_id": ...` twice: msgspec alone keeps the last silently
            text = text[:-1] + ', "run_id": "other"}'
        (dst / "run.json").write_text(text)
        if edit_steps:
            edit_steps(dst / "steps.csv")
    deep = root / "nested-run-json"
    deep.mkdir()
    (deep / "run.json").write_text('{"schema_version": 1, "x": ' + "[" * DEEP + "]" * DEEP + "}")


def load_gz_json(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def first_step(trace: dict) -> dict:
    return next(e for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))


def extra_step(**fields) -> Callable[[dict], None]:
    """Add one more ProfilerStep copy with `fields` changed (None deletes the field)."""

    def edit(trace: dict) -> None:
        ev = dict(first_step(trace))
        for k, v in fields.items():
            if v is None:
                ev.pop(k, None)
            else:
                ev[k] = v
        trace["traceEvents"].append(ev)

    return edit


# name -> trace edit; each adds one impossible ProfilerStep the analysis must drop
EVENT_CASES = {
    "negative-dur": extra_step(dur=-5000),
    "no-ts": extra_step(ts=None),
    "no-dur": extra_step(dur=None),
    "huge-dur": extra_step(dur=1e308),
}


def deep_top(trace: dict) -> str:
    return json.dumps(trace)[:-1] + ', "deep": ' + "[" * DEEP + "]" * DEEP + "}"


def deep_args(trace: dict) -> str:
    text = json.dumps(trace)
    marker = '"args": {'
    i = text.index(marker) + len(marker)
    return text[:i] + '"deep": ' + "[" * DEEP + "]" * DEEP + ", " + text[i:]


def with_bad_rank1(tmp: Path, ddp_traces, edit: Callable[[dict], None], text: str | None = None):
    r0, r1 = ddp_traces
    shutil.copy(r0, tmp / r0.name)
    trace = load_gz_json(r1)
    edit(trace)
    data = (text or json.dumps(trace)).encode()
    (tmp / r1.name).write_bytes(gzip.compress(data))
    return tmp / r1.name


@pytest.fixture(scope="module")
def ddp_traces(ddp_mlp_run) -> tuple[Path, Path]:
    r0, r1 = sorted((ddp_mlp_run / "traces").glob("rank*.pt.trace.json.gz"))
    return r0, r1


@pytest.fixture(scope="module")
def clean_ranks(ddp_traces, tmp_path_factory) -> dict[int, dict]:
    d = tmp_path_factory.mktemp("clean")
    for f in ddp_traces:
        shutil.copy(f, d / f.name)
    return {r["rank"]: r for r in analyze_trace_dir(d, workers=1, progress=False)["ranks"]}
