"""Hostile input v2 (issue 25 B), the run-folder and record classes: one reading boundary for
run.json, steps.csv, comm.csv, tune.json and traces parts (regular files only, size limits, BOM,
duplicates, lone surrogates), cross-file consistency of a run folder, and bounded work.

Bad folders are copies of the session's real runs and of a real 2-rank gloo comm benchmark with
one thing edited; the run.json/steps.csv cases that end `invalid` are in tests/hostile_common.py
(RUN_CASES), checked by tests/test_hostile.py together with the report over all of them.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis.cli.main import main as analysis_main
from analysis.report.__main__ import main as report_main
from analysis.runs.compare import compare_runs
from profiler.runfolder.inputfile import BOM, MAX_DEPTH
from profiler.runfolder.steps import MAX_CELL_CHARS, read_steps_frame
from tests.conftest import in_process, read_run
from tests.hostile_common import cli


def _copy(src: Path, dst: Path, **rec_edits) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("traces"))
    rec = read_run(dst)
    rec.update(traces=[], **rec_edits)
    (dst / "run.json").write_text(json.dumps(rec))
    return dst


# ---------------------------------------------------------------------------------------------
# Class 1: strings never cost a run; step times 0 or 1e308 never divide by zero
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("escape", ["\\udc80", "\\ud800x", "a\\udfffb"])
def test_lone_surrogate_in_run_id_is_a_replacement_character(escape, tmp_path, single_mlp_run):
    run = _copy(single_mlp_run, tmp_path / "runs" / "s")
    text = (run / "run.json").read_text()
    rec = json.loads(text)
    text = text.replace(json.dumps(rec["run_id"]), f'"run{escape}"', 1)  # the raw JSON escape
    (run / "run.json").write_text(text)
    (entry,) = compare_runs([tmp_path / "runs"], progress=False, traces=False)["runs"]
    assert "\ufffd" in entry["run_id"] and entry["samples_per_s"] > 0
    out = tmp_path / "report"
    assert report_main([str(tmp_path / "runs"), "--out", str(out), "--no-progress"]) == 0
    assert entry["run_id"] in (out / "index.html").read_text(encoding="utf-8")  # figures drawn too


def test_non_utf8_folder_name_reaches_the_report(tmp_path, single_mlp_run):
    runs = tmp_path / "runs"
    runs.mkdir()
    name = os.fsdecode(b"run-\xff")  # a lone surrogate in Python's view of the name
    rec = read_run(single_mlp_run)
    _copy(single_mlp_run, runs / name)
    rec = read_run(runs / name)
    del rec["run_id"]
    (runs / name / "run.json").write_text(json.dumps(rec))
    out = tmp_path / "report"
    assert report_main([str(runs), "--out", str(out), "--no-progress"]) == 0
    assert "run-\ufffd" in (out / "index.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("value", ["0", "1e308"])
def test_every_step_time_zero_or_huge_is_no_traceback(value, tmp_path, single_mlp_run, ddp_mlp_run):
    runs = tmp_path / "runs"
    for src in (single_mlp_run, ddp_mlp_run):
        run = _copy(src, runs / src.name)
        steps = pd.read_csv(run / "steps.csv")
        cols = ["step_time_s", "data_s", "forward_s", "backward_s", "optimizer_s"]
        steps[cols] = float(value)
        steps.to_csv(run / "steps.csv", index=False)
        rec = read_run(run)
        rec["metrics"]["step_time_s"] = {"mean": float(value), "p50": 0.0, "p95": float(value)}
        (run / "run.json").write_text(json.dumps(rec))
    out = tmp_path / "report"
    proc = in_process(report_main, [str(runs), "--out", str(out), "--no-progress"])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    json.loads((out / "summary.json").read_text())


def test_tune_json_damage_is_one_skipped_line(tmp_path, single_mlp_run):
    """tune.json nested 100,000 deep, with no string `workload.model`, a FIFO, duplicate keys,
    a lone surrogate (accepted): each costs its folder a skipped line, never the report."""
    runs = tmp_path / "runs"
    _copy(single_mlp_run, runs / "single")
    good = {"tune_id": "t\\udc80", "workload": {"model": "mlp"}, "candidates": [], "command": "x"}
    cases = {
        "deep": '{"candidates": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "no-model": json.dumps({"workload": {"model": 5}, "candidates": []}),
        "dup": '{"candidates": [], "workload": {"model": "a"}, "candidates": []}',
        "surrogate": json.dumps(good).replace("\\\\udc80", "\\udc80"),
    }
    for name, text in cases.items():
        (runs / f"tune-{name}").mkdir()
        (runs / f"tune-{name}" / "tune.json").write_text(text)
    (runs / "tune-fifo").mkdir()
    os.mkfifo(runs / "tune-fifo" / "tune.json")
    data = compare_runs([runs], progress=False, traces=False)
    reasons = {Path(s["path"]).parent.name: s["reason"] for s in data["skipped"]}
    assert "nested too deeply" in reasons["tune-deep"]
    assert "workload.model" in reasons["tune-no-model"]
    assert "`candidates` given twice" in reasons["tune-dup"]
    assert "FIFO" in reasons["tune-fifo"]
    assert [t["tune_id"] for t in data["tunes"]] == ["t\ufffd"]
    assert [r["run_id"] for r in data["runs"]] == [read_run(single_mlp_run)["run_id"]]


# ---------------------------------------------------------------------------------------------
# Class 2: FIFOs and other non-regular files never hang a reader
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["runs", "report"])
def test_fifo_steps_and_comm_csv_never_hang(command, tmp_path, single_mlp_run, comm_run):
    runs = tmp_path / "runs"
    fifo_run = _copy(single_mlp_run, runs / "fifo-steps")
    (fifo_run / "steps.csv").unlink()
    os.mkfifo(fifo_run / "steps.csv")
    comm = runs / "fifo-comm"
    shutil.copytree(comm_run, comm)
    (comm / "comm.csv").unlink()
    os.mkfifo(comm / "comm.csv")
    _copy(single_mlp_run, runs / "good")
    args = {
        "runs": ["-m", "analysis", "runs", str(runs), "--no-traces", "--no-progress"],
        "report": [
            "-m",
            "analysis.report",
            str(runs),
            "--out",
            str(tmp_path / "r"),
            "--no-progress",
        ],
    }[command]
    proc = cli(*args)  # cli() has a timeout: a hang fails the test instead of the suite
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    out = proc.stdout if command == "runs" else (tmp_path / "r" / "summary.csv").read_text()
    assert "FIFO" in out or "FIFO" in proc.stdout


# ---------------------------------------------------------------------------------------------
# Class 3 (run folders): comm runs consistent with their run.json; traces/ as a file
# ---------------------------------------------------------------------------------------------


def _edit_comm_csv(path: Path, **cells) -> None:
    rows = pd.read_csv(path, dtype=str, keep_default_na=False)
    for col, value in cells.items():
        rows.loc[0, col] = value
    rows.to_csv(path, index=False)


COMM_CASES = {
    "config-list": (lambda rec: rec.update(config=[1]), None, "`config`"),
    "metrics-string": (lambda rec: rec.update(metrics="x"), None, "`metrics`"),
    "world-size-abc": (lambda rec: rec["config"].update(world_size="abc"), None, "world_size"),
    "csv-world-inf": (None, {"world_size": "inf"}, "`world_size, line 2`: not a finite"),
    "csv-world-64": (None, {"world_size": "64"}, "run.json config.world_size is 2"),
    "csv-bytes-negative": (None, {"bytes": "-4"}, "`bytes, line 2`: negative"),
    "csv-300000-rows": (None, 300_000, "byte limit of a comm.csv"),  # refused before parsing
    "csv-20000-rows": (None, 20_000, "over 10,000 rows"),
    "csv-duplicate-column": (None, "dupcol", "given twice"),
}


def _make_comm_case(comm_run: Path, dst: Path, edit_json, edit_csv) -> None:
    shutil.copytree(comm_run, dst)
    rec = read_run(dst)
    rec["run_id"] = dst.name
    if edit_json:
        edit_json(rec)
    (dst / "run.json").write_text(json.dumps(rec))
    if isinstance(edit_csv, int):
        lines = (dst / "comm.csv").read_text().splitlines()
        head, row = lines[0], lines[1].split(",")
        body = (",".join([row[0], row[1], row[2], str(i), *row[4:]]) for i in range(edit_csv))
        (dst / "comm.csv").write_text("\n".join([head, *body]) + "\n")
    elif edit_csv == "dupcol":
        lines = (dst / "comm.csv").read_text().splitlines()
        (dst / "comm.csv").write_text("\n".join(f"{ln},{ln.split(',')[0]}" for ln in lines))
    elif edit_csv:
        _edit_comm_csv(dst / "comm.csv", **edit_csv)


def test_each_bad_comm_run_is_one_line_and_projections_stay(tmp_path, comm_run, single_mlp_run):
    runs = tmp_path / "runs"
    _copy(single_mlp_run, runs / "single")
    shutil.copytree(comm_run, runs / "good-comm")
    for name, (edit_json, edit_csv, _) in COMM_CASES.items():
        _make_comm_case(comm_run, runs / f"comm-{name}", edit_json, edit_csv)
    data = compare_runs([runs], progress=False, traces=False)
    assert [c["run_id"] for c in data["comm"]] == [read_run(comm_run)["run_id"]]
    assert len(data["projections"]) == 1 and data["projections"][0]["comm_path"].endswith(
        "good-comm"
    )
    reasons = {Path(s["path"]).name: s["reason"] for s in data["projection_skipped"]}
    for name, (*_, words) in COMM_CASES.items():
        assert words in reasons[f"comm-{name}"], (name, reasons[f"comm-{name}"])
        assert "\n" not in reasons[f"comm-{name}"]


def test_traces_as_a_regular_file_is_a_warning(tmp_path, ddp_mlp_run):
    run = tmp_path / "ddp"
    shutil.copytree(ddp_mlp_run, run)
    shutil.rmtree(run / "traces")
    (run / "traces").write_text("not a folder")
    (entry,) = compare_runs([run], progress=False)["runs"]
    assert entry["trace"] is None
    assert any("traces" in w and "not a folder" in w for w in entry["warnings"])


# ---------------------------------------------------------------------------------------------
# Classes 6 and 7: bounded work; BOM; a cell over the field limit
# ---------------------------------------------------------------------------------------------


def test_bom_steps_csv_is_read_as_written(tmp_path, ddp_mlp_run):
    clean = compare_runs([ddp_mlp_run], progress=False, traces=False)["runs"][0]
    run = _copy(ddp_mlp_run, tmp_path / "bom")
    (run / "steps.csv").write_bytes(BOM + (run / "steps.csv").read_bytes())
    (run / "run.json").write_bytes(BOM + (run / "run.json").read_bytes())
    (entry,) = compare_runs([run], progress=False, traces=False)["runs"]
    assert (
        entry["phases_s"] == clean["phases_s"] and entry["samples_per_s"] == clean["samples_per_s"]
    )


def test_cell_over_the_field_limit_is_invalid_naming_file_and_row(tmp_path, ddp_mlp_run):
    run = _copy(ddp_mlp_run, tmp_path / "runs" / "huge-cell")
    rows = list(csv.DictReader((run / "steps.csv").open()))
    rows[4]["epoch"] = "1" * (MAX_CELL_CHARS + 1)
    with (run / "steps.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (hit,) = compare_runs([tmp_path / "runs"], progress=False, traces=False)["invalid"]
    assert hit["file"].endswith("steps.csv") and "`epoch, line 6`" in hit["reason"]


def test_million_row_steps_csv_is_decoded_once_with_bounded_memory(tmp_path, ddp_mlp_run):
    """1,000,000 rows (~130 MB): what the columnar reader adds to the peak RSS of the same
    fresh process reading the run's own few-row steps.csv stays within a few times the file's
    size (the dict-per-row reader took 2.4 GB); a difference within one machine, not a budget."""
    header, row = (ddp_mlp_run / "steps.csv").read_text().splitlines()[:2]
    rest = row.split(",", 3)[3]
    path = tmp_path / "steps.csv"
    with path.open("w") as f:
        f.write(header + "\n")
        f.writelines(f"{i % 2},0,{i // 2},{rest}\n" for i in range(1_000_000))
    code = (
        "import sys; from profiler.runfolder.steps import read_steps_frame\n"
        "f = read_steps_frame(sys.argv[1], world_size=2)\n"
        # VmHWM, not ru_maxrss: after fork+exec ru_maxrss keeps the parent's (pytest's) peak.
        "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
        "print(len(f), int(hwm.split()[1]) * 1024)\n"
    )
    peaks = {}
    for name, csv_path in (("small", ddp_mlp_run / "steps.csv"), ("big", path)):
        proc = cli("-c", code, str(csv_path))
        assert proc.returncode == 0, proc.stderr
        peaks[name] = tuple(map(int, proc.stdout.split()))
    assert peaks["big"][0] == 1_000_000
    extra, size = peaks["big"][1] - peaks["small"][1], path.stat().st_size
    assert extra < 5 * size, f"{extra / 1e6:.0f} MB more RSS for a {size / 1e6:.0f} MB file"


def test_size_limit_refuses_before_reading(tmp_path, ddp_mlp_run, monkeypatch):
    monkeypatch.setenv("DPSCOPE_MAX_STEPS_CSV_BYTES", "100")
    run = _copy(ddp_mlp_run, tmp_path / "runs" / "big")
    (hit,) = compare_runs([tmp_path / "runs"], progress=False, traces=False)["invalid"]
    assert (
        "over the 100-byte limit" in hit["reason"]
        and "DPSCOPE_MAX_STEPS_CSV_BYTES" in hit["reason"]
    )
    monkeypatch.delenv("DPSCOPE_MAX_STEPS_CSV_BYTES")
    assert len(read_steps_frame(run / "steps.csv", world_size=2)) > 0


# ---------------------------------------------------------------------------------------------
# Class 1: tampered `analysis merge` parts
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parts(ddp_mlp_run, tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("parts")
    out = []
    for k in (0, 1):
        p = d / f"part-{k}.json"
        argv = ["traces", str(ddp_mlp_run / "traces"), "--shard", f"{k}/2", "--json", str(p)]
        assert analysis_main([*argv, "--no-progress"]) == 0
        out.append(p)
    return out


def _first_instances(part: dict) -> dict:
    return next(iter(part["summaries"][0]["instances"].values()))


MERGE_CASES = {
    "shard-abc": (lambda p: p.update(shard="abc"), "broken traces part"),
    "shards-1e10": (lambda p: p.update(shards=10**10), "broken traces part"),
    "shard-beyond": (lambda p: p.update(shard=5), "is shard 5 of only 2"),
    "no-instances": (lambda p: p["summaries"][0].pop("instances"), "broken rank summary"),
    "ragged": (
        lambda p: next(iter(_first_instances(p).values())).append(1.0),
        "ragged call arrays",
    ),
    "text-array": (
        lambda p: _first_instances(p).update({k: ["x"] for k in _first_instances(p)}),
        "broken rank summary",
    ),
    "deep": (
        lambda p: p.update(x=json.loads("[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5))),
        "nested too deeply",
    ),
}


@pytest.mark.parametrize("case", list(MERGE_CASES))
def test_tampered_merge_part_is_one_line(case, parts, tmp_path, capsys):
    edit, words = MERGE_CASES[case]
    part = json.loads(parts[1].read_text())
    if case in ("ragged", "text-array") and not part["summaries"][0]["instances"]:
        part = json.loads(parts[0].read_text())
    edit(part)
    bad = tmp_path / "part-bad.json"
    bad.write_text(json.dumps(part))
    others = [p for p in parts if json.loads(p.read_text())["shard"] != part.get("shard")]
    assert analysis_main(["merge", *map(str, [*others, bad])]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert words in line and "part-bad.json" in line, line
