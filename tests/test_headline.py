"""Issue 8: headline numbers that hold — the `profiled` column, throughput outside the profiler
window, one memory-imbalance definition, latency = transfer + sync, one "same workload" key."""

from __future__ import annotations

import csv
import gzip
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from msgspec.structs import asdict

from analysis.cli.main import main as analysis_main
from analysis.report.build import write_report
from analysis.report.findings import findings
from analysis.report.scaling import group_labels, scaling_frame
from analysis.runs.compare import compare_runs
from analysis.runs.entry import load_run
from analysis.trace.crossrank import combine_collectives
from analysis.trace.folder import analyze_trace_dir
from profiler.runfolder.stepmetrics import step_metrics
from profiler.session import ProfileConfig
from tests.conftest import TINY, in_process, launch, read_run
from tests.test_runfolder import step_rows


def _steps(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(run_dir / "steps.csv")


def _trace_steps(path: Path) -> set[int]:
    """ProfilerStep#N numbers in a real trace file, read straight from its JSON."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return {
        int(m.group(1))
        for e in events
        if (m := re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name", ""))))
    }


# --- the `profiled` column -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "steps", "profiled", "active"),
    [
        # wait 1, warm-up 1, active 3, once: step 0 waits, 1 warms up, 2-4 are recorded.
        ({}, 8, {1, 2, 3, 4}, {2, 3, 4}),
        ({"repeat": 2}, 14, {1, 2, 3, 4, 6, 7, 8, 9}, {2, 3, 4, 7, 8, 9}),
        ({"wait": 0, "warmup": 0, "active": 2, "repeat": 0}, 5, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}),
        ({"enabled": False}, 8, set(), set()),
    ],
)
def test_phase_follows_the_schedule(schedule, steps, profiled, active):
    cfg = ProfileConfig(**schedule)
    phases = [cfg.phase(s) for s in range(steps)]
    assert {s for s, p in enumerate(phases) if p != "none"} == profiled
    assert {s for s, p in enumerate(phases) if p == "active"} == active


def test_profiled_column_matches_the_real_traces(single_mlp_run, ddp_mlp_run):
    """steps.csv `profiled` = the schedule's warm-up + active steps of the run's own config; the
    ProfilerStep#N numbers in each rank's real trace are exactly the active ones."""
    for run_dir in (single_mlp_run, ddp_mlp_run):
        run, steps = read_run(run_dir), _steps(run_dir)
        cfg = ProfileConfig(**run["config"]["profile"])
        for rank, mine in steps.groupby("rank"):
            expected = [int(cfg.phase(s) != "none") for s in mine["step"]]
            assert mine["profiled"].tolist() == expected == [0, 1, 1, 1, 1, 0, 0, 0]
            (trace,) = [t for t in run["traces"] if Path(t).name.startswith(f"rank{rank}.")]
            active = {s for s in mine["step"] if cfg.phase(s) == "active"}
            assert _trace_steps(run_dir / trace) == active == {2, 3, 4}


def test_throughput_uses_only_unprofiled_measured_steps(single_mlp_run, ddp_mlp_run):
    """run.json samples_per_s / step_time_s / per_rank / profiler_overhead_pct recomputed from
    steps.csv with pandas, independently of profiler.runfolder.stepmetrics."""
    for run_dir in (single_mlp_run, ddp_mlp_run):
        m, steps = read_run(run_dir)["metrics"], _steps(run_dir)
        clean = steps[(steps.warmup == 0) & (steps.profiled == 0)]
        assert len(clean) == 3 * steps["rank"].nunique()  # steps 5, 6, 7 on every rank
        per_rank_s = clean.groupby("rank")["step_time_s"].sum()
        assert m["samples_per_s"] == pytest.approx(clean["samples"].sum() / per_rank_s.max())
        assert m["step_time_s"]["mean"] == pytest.approx(clean["step_time_s"].mean())
        assert [p["steps"] for p in m["per_rank"]] == [3] * len(per_rank_s)
        # A traced step's own time: without the profiler's work at its end (the export).
        traced = steps[steps.step.isin([2, 3, 4])].assign(
            own=lambda d: d.step_time_s - d.profiler_s
        )
        active = traced.groupby("rank")["own"].mean().max()
        base = clean.groupby("rank")["step_time_s"].mean().max()
        assert m["profiler_overhead_pct"] == pytest.approx((active / base - 1) * 100)


def test_step_metrics_drop_profiled_steps_and_fall_back_with_a_warning():
    rows = [
        {"rank": 0, "step": s, "warmup": int(s == 0), "profiled": int(s in (1, 2)), "samples": 10,
         "step_time_s": t}
        for s, t in enumerate([9.0, 3.0, 3.0, 1.0, 1.0])
    ]  # fmt: skip
    m, warnings = step_metrics(step_rows(rows), {(0, 2)})
    assert m.samples_per_s == pytest.approx(20 / 2.0) and warnings == []
    assert m.profiler_overhead_pct == pytest.approx(200.0)  # 3 s traced vs 1 s clean
    all_profiled = [{**r, "profiled": int(r["step"] > 0)} for r in rows]
    m, warnings = step_metrics(step_rows(all_profiled), {(0, 2)})
    assert m.samples_per_s == pytest.approx(40 / 8.0)  # every measured step, 10 samples each
    assert m.profiler_overhead_pct is None
    assert len(warnings) == 1 and "profiled steps" in warnings[0]


@pytest.mark.integration
def test_fallback_warning_reaches_run_json_and_the_report(tmp_path):
    """4 steps, 2 warm-up, profiler window 1-4: no measured step is unprofiled."""
    args = [a if a != "8" else "4" for a in TINY]
    launch(["--mode", "single", "--run-id", "short", "--runs-dir", str(tmp_path), *args])
    run = read_run(tmp_path / "short")
    assert len(run["warnings"]) == 1 and "include profiled steps" in run["warnings"][0]
    steps = _steps(tmp_path / "short")
    measured = steps[steps.warmup == 0]
    assert measured["profiled"].all()
    assert run["metrics"]["samples_per_s"] == pytest.approx(
        measured["samples"].sum() / measured["step_time_s"].sum()
    )
    entry = asdict(load_run(tmp_path / "short"))  # the RunEntry as its runs-JSON dict
    assert run["warnings"][0] in entry["warnings"]
    data = compare_runs([tmp_path], progress=False, traces=False)
    assert any(run["warnings"][0] in f.text for f in findings(data))


def test_schema_1_folder_is_read_with_a_warning(single_mlp_run, tmp_path):
    """A schema-1 folder (no `profiled` column): read as written, with a warning."""
    old = tmp_path / "old"
    shutil.copytree(single_mlp_run, old)
    rec = read_run(old)
    rec["schema_version"] = 1
    for key in ("warnings",):
        rec.pop(key)
    rec["metrics"].pop("profiler_overhead_pct")
    (old / "run.json").write_text(json.dumps(rec))
    _steps(old).drop(columns="profiled").to_csv(old / "steps.csv", index=False)
    entry = asdict(load_run(old))
    assert entry["samples_per_s"] == rec["metrics"]["samples_per_s"]
    assert entry["profiler_overhead_pct"] is None
    assert any("no `profiled` column" in w for w in entry["warnings"])
    measured = _steps(old).query("warmup == 0")
    assert entry["phases_s"]["forward"] == pytest.approx(measured["forward_s"].mean())


# --- one memory-imbalance definition ------------------------------------------------------------


def test_memory_imbalance_is_one_number_everywhere(ddp_mlp_run, tmp_path):
    """Ranks at 100 and 150 MiB: 50% in the runs JSON, the finding, summary.json, the CSV and
    the CLI; max/mean (1.2) only in its own extra column."""
    run_dir = tmp_path / "runs" / "ddp"
    shutil.copytree(ddp_mlp_run, run_dir)
    rec = read_run(run_dir)
    for m, mib in zip(rec["metrics"]["memory"], (100, 150), strict=True):
        m["peak_rss_bytes"] = mib * 2**20
    (run_dir / "run.json").write_text(json.dumps(rec))
    data = compare_runs([tmp_path / "runs"], progress=False, traces=False)
    (run,) = data["runs"]
    assert run["memory_imbalance_pct"] == pytest.approx(50.0)
    assert run["memory_imbalance_max_over_mean"] == pytest.approx(150 / 125)
    texts = [f.text for f in findings(data) if f.rule == "memory"]
    assert texts == [
        "DDP (GLOO) holds 50% more memory on rank 1 (cpu) than on rank 0 (cpu) "
        "(peak RSS; imbalance threshold 10%)."
    ]
    files = write_report(data, tmp_path / "report")
    summary = json.loads(files.summary_json.read_text())
    assert summary["runs"][0]["memory_imbalance_pct"] == pytest.approx(50.0)
    with open(tmp_path / "report" / "memory.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {float(r["memory_imbalance_pct"]) for r in rows} == {50.0}
    cli = in_process(
        analysis_main, ["runs", str(tmp_path / "runs"), "--no-traces", "--no-progress"]
    )
    assert cli.returncode == 0, cli.stderr
    header, row = cli.stdout.splitlines()[:2]
    # The terminal table uses the report's column spec: the same header, unit and format.
    assert "Memory imbalance (% more, fullest vs emptiest)" in header and "max/mean" not in header
    assert "50.0" in row.split()


# --- collectives: latency = transfer + sync -------------------------------------------------------


def _calls(starts, latency, device):
    return {
        "start_us": np.array(starts, float),
        "latency_us": np.array(latency, float),
        "device_us": np.array(device, float),
        "bytes": np.zeros(len(starts), np.int64),
        "group_size": np.zeros(len(starts), np.int64),
        "union_us": 0.0,
    }


def test_latency_is_transfer_plus_sync_per_call_and_in_total():
    """Hand-built: two overlapping calls per rank (as gloo's threads make them) and an extra
    call on rank 0. Per call: transfer = min device over ranks, sync = latency − transfer."""
    per_rank = {
        0: {"gloo:all_reduce": _calls([0, 5, 50], [20, 30, 7], [10, 12, 7])},
        1: {"gloo:all_reduce": _calls([2, 6], [15, 25], [8, 20])},
    }
    out = combine_collectives(per_rank, 2)
    r0, r1 = out["collectives_per_rank"]
    # transfers: min(10, 8) = 8, min(12, 20) = 12, rank 0's unmatched call is its own 7
    assert (r0["latency_us_total"], r0["transfer_us_total"], r0["sync_us_total"]) == (57, 27, 30)
    assert (r1["latency_us_total"], r1["transfer_us_total"], r1["sync_us_total"]) == (40, 20, 20)
    (agg,) = out["collectives"]
    assert agg["latency_us_total"] == agg["transfer_us_total"] + agg["sync_us_total"] == 48.5


def test_latency_identity_holds_on_a_real_ddp_trace(ddp_mlp_run):
    result = analyze_trace_dir(ddp_mlp_run / "traces", progress=False)
    rows = result["collectives_per_rank"] + result["collectives"]
    assert rows
    for r in rows:
        assert r["sync_us_total"] >= 0
        assert r["latency_us_total"] == pytest.approx(
            r["transfer_us_total"] + r["sync_us_total"], rel=1e-9
        )
        assert r["latency_us_total"] >= r["latency_us_union"] - 1e-6


# --- one "same workload" key -----------------------------------------------------------------


def _variant(src: Path, parent: Path, name: str, *, config=None, env=None) -> Path:
    dst = parent / name
    shutil.copytree(src, dst)
    rec = read_run(dst)
    rec["run_id"] = name
    rec["config"].update(config or {})
    rec["env"].update(env or {})
    (dst / "run.json").write_text(json.dumps(rec))
    return dst


def test_bf16_fp32_and_other_os_runs_are_never_pooled(single_mlp_run, ddp_mlp_run, tmp_path):
    runs = tmp_path / "runs"
    _variant(single_mlp_run, runs, "single-fp32")
    _variant(single_mlp_run, runs, "single-bf16", config={"amp": "bf16"})
    _variant(ddp_mlp_run, runs, "ddp-fp32")
    _variant(ddp_mlp_run, runs, "ddp-bf16", config={"amp": "bf16"})
    _variant(ddp_mlp_run, runs, "ddp-win", env={"os": "Windows"})
    _variant(ddp_mlp_run, runs, "ddp-cuda", config={"devices": ["cuda:0", "cuda:1"]})
    data = compare_runs([runs], progress=False, traces=False)
    by_id = {r["run_id"]: r for r in data["runs"]}
    assert by_id["ddp-fp32"]["baseline_run_id"] == "single-fp32"
    assert by_id["ddp-bf16"]["baseline_run_id"] == "single-bf16"
    assert by_id["ddp-win"]["baseline_run_id"] is None  # no Windows single run to compare with
    assert by_id["ddp-cuda"]["baseline_run_id"] is None  # nor a CUDA one
    groups = sorted(sorted(g["run_ids"]) for g in data["groups"])
    assert groups == [["ddp-bf16"], ["ddp-cuda"], ["ddp-fp32"], ["ddp-win"], ["single-bf16"],
                      ["single-fp32"]]  # fmt: skip
    accuracy = [f for f in findings(data) if f.rule == "accuracy"]
    for f in accuracy:  # each DDP group is compared with the single run of its own workload
        amps = {by_id[r]["amp"] for r in f.run_ids}
        oses = {by_id[r]["os"] for r in f.run_ids}
        assert len(amps) == 1 and len(oses) == 1, f.text
    assert {tuple(sorted(f.run_ids)) for f in accuracy} == {
        ("ddp-bf16", "single-bf16"),
        ("ddp-fp32", "single-fp32"),
    }
    # The sweep view (group labels, scaling curves) keeps them apart too: one label per group,
    # and every scaling-curve series holds runs of one workload only.
    labels = group_labels(data)
    assert len({labels[r] for r in by_id}) == len(data["groups"]), labels
    frame = scaling_frame(data)
    for _, series in frame.groupby(["panel", "series"]):
        assert len(series[["amp", "device_type", "os"]].drop_duplicates()) == 1, series
