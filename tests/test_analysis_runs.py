"""Analysis of real run folders from the real launcher (session fixtures in conftest.py)."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from analysis.runs.compare import compare_runs
from analysis.runs.fields import memory_peaks
from analysis.trace.folder import analyze_trace_dir
from profiler.runfolder.lease import OWNER_JSON, claim, owner_record
from tests.conftest import read_run


def test_gloo_allreduce_calls_and_bytes_are_exact(ddp_mlp_run):
    """DDP all-reduces every gradient once per step, in buckets: the trace must show exactly
    (analysed steps × buckets) gloo:all_reduce calls carrying 4 bytes per parameter each step."""
    import torch  # the test derives the size from the model itself; analysis/ never imports torch

    from workloads.train.models import build_model

    rec = read_run(ddp_mlp_run)
    params = sum(p.numel() for p in build_model("mlp", num_classes=10).parameters())
    grad_bytes = params * torch.finfo(torch.float32).bits // 8
    cap_bytes = rec["config"]["ddp"]["bucket_cap_mb"] * 2**20
    buckets = math.ceil(grad_bytes / cap_bytes)  # 3.4 MB of gradients, 25 MiB buckets: one
    assert rec["metrics"]["ddp"]["param_count"] == params
    assert rec["metrics"]["ddp"]["num_buckets"] == buckets == 1

    result = analyze_trace_dir(ddp_mlp_run / "traces", progress=False)
    prof = rec["config"]["profile"]
    steps = prof["active"] * prof["repeat"] - 1  # the last ProfilerStep is not analysed
    assert result["kind"] == "cpu" and result["world_size"] == 2 and not result["skipped"]
    assert [r["steps"] for r in result["ranks"]] == [steps, steps]
    rows = [r for r in result["collectives_per_rank"] if r["name"] == "gloo:all_reduce"]
    assert [r["rank"] for r in rows] == [0, 1]
    for row in rows:
        assert row["calls"] == steps * buckets
        assert row["bytes_total"] == steps * grad_bytes
    (ar,) = [c for c in result["collectives"] if c["name"] == "gloo:all_reduce"]
    assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"] * 2 * (2 - 1) / 2)
    for r in result["ranks"]:
        assert 0 < r["comm_us"] < r["step_time_us_mean"]
        assert 0 <= r["exposed_comm_us"] <= r["comm_us"]
        assert r["data_wait_us"] > 0  # the workload's `data` record_function range
        split = r["tb_split"]
        # tb-profiler averages over all profiled steps (dpscope drops the last): 3 of them here.
        assert r["tb_split_steps"] == steps + 1
        assert sum(split.values()) == pytest.approx(r["tb_split_step_time_us_mean"], rel=1e-6)
    assert {s["rank"] for s in result["stragglers"]} == {0, 1}
    assert sum(s["straggler_score"] for s in result["stragglers"]) == pytest.approx(1.0)


def test_compare_runs_on_real_single_and_ddp(runs_dir, single_mlp_run, ddp_mlp_run):
    result = compare_runs([runs_dir], progress=False)
    runs = {r["run_id"]: r for r in result["runs"]}
    single, ddp = runs["single-mlp"], runs["ddp-gloo-mlp"]
    assert single["speedup"] == pytest.approx(1.0) and single["baseline_run_id"] == "single-mlp"
    assert ddp["baseline_run_id"] == "single-mlp"
    assert ddp["speedup"] == pytest.approx(ddp["samples_per_s"] / single["samples_per_s"])
    assert ddp["scaling_efficiency"] == pytest.approx(ddp["speedup"] / 2)
    assert set(ddp["phases_s"]) == {"data", "forward", "backward", "optimizer"}
    assert [p["rank"] for p in ddp["phases_per_rank_s"]] == [0, 1]
    assert ddp["trace"]["world_size"] == 2 and 0 < ddp["comm_pct"] < 100
    assert single["comm_pct"] == 0.0 and single["trace"]["ranks"][0]["rank"] == 0
    assert ddp["memory_metric"] == "peak_rss_bytes" and ddp["memory_imbalance_pct"] >= 0
    assert ddp["test_loss"] is not None and ddp["top1_pct"] is not None
    groups = {(g["mode"], g["world_size"]) for g in result["groups"]}
    assert {("single", 1), ("ddp", 2)} <= groups
    json.dumps(result, allow_nan=False)  # the CLI's --json output must be strict JSON


def test_failed_running_and_corrupt_runs_are_listed(tmp_path, ddp_mlp_run, single_mlp_run):
    shutil.copytree(single_mlp_run, tmp_path / "single-mlp")
    for run_id, status in (("ddp-failed", "failed"), ("ddp-running", "running")):
        shutil.copytree(ddp_mlp_run, tmp_path / run_id)
        rec = read_run(ddp_mlp_run)
        rec.update(
            run_id=run_id,
            status=status,
            metrics={},
            error={
                "message": "rank 1 exited with 1",
                "rank": 1,
                "exit_code": 1,
                "log_tail": ["boom"],
            }
            if status == "failed"
            else None,
        )
        (tmp_path / run_id / "run.json").write_text(json.dumps(rec))
    # the copied owner.json names the fixture's launcher, long gone: this process is the live one
    (tmp_path / "ddp-running" / OWNER_JSON).unlink(missing_ok=True)
    claim(tmp_path / "ddp-running", owner_record("launcher"))
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "run.json").write_text('{"run_id": "cor')
    result = compare_runs([tmp_path], progress=False, traces=False)
    runs = {r["run_id"]: r for r in result["runs"]}
    assert runs["ddp-failed"]["status"] == "failed"
    assert runs["ddp-failed"]["error"]["message"] == "rank 1 exited with 1"
    assert runs["ddp-failed"]["speedup"] is None and runs["ddp-failed"]["samples_per_s"] is None
    assert runs["ddp-running"]["status"] == "running"
    (corrupt,) = [s for s in result["skipped"] if s["path"].endswith("corrupt")]
    assert "unreadable" in corrupt["reason"]
    assert [g["mode"] for g in result["groups"]] == ["single"]  # only ok runs are grouped


def test_same_run_id_in_two_folders_never_merges(tmp_path, ddp_mlp_run, single_mlp_run):
    """The same --run-id copied from two machines: both runs stay, each with its own numbers."""
    for machine in ("linux", "windows"):
        shutil.copytree(single_mlp_run, tmp_path / machine / "single")
        shutil.copytree(ddp_mlp_run, tmp_path / machine / "ddp")
    rec = read_run(tmp_path / "windows" / "ddp")
    rec["metrics"]["samples_per_s"] *= 2  # the other machine was twice as fast
    (tmp_path / "windows" / "ddp" / "run.json").write_text(json.dumps(rec))
    result = compare_runs([tmp_path / "linux", tmp_path / "windows"], progress=False, traces=False)
    runs = {r["run_id"]: r for r in result["runs"]}
    first, second = read_run(ddp_mlp_run)["run_id"], f"{rec['run_id']}@windows"
    assert len(runs) == len(result["runs"]) == 4 and {first, second} <= runs.keys()
    assert runs[second]["samples_per_s"] == pytest.approx(2 * runs[first]["samples_per_s"])
    assert any("already used" in w for w in runs[second]["warnings"])
    (ddp,) = [g for g in result["groups"] if g["mode"] == "ddp"]
    assert sorted(ddp["run_ids"]) == sorted([first, second]) and ddp["n_runs"] == 2


def test_memory_imbalance_definitions():
    gpu = [{"peak_allocated_bytes": v, "peak_rss_bytes": 1} for v in (100, 200, 300)]
    m = memory_peaks(gpu)
    assert m["memory_metric"] == "peak_allocated_bytes" and m["peak_memory_bytes"] == 300
    assert m["memory_imbalance_pct"] == pytest.approx(200.0)  # 300 is 200% more than 100
    assert m["memory_imbalance_max_over_mean"] == pytest.approx(1.5)  # the extra column
    cpu = [{"peak_allocated_bytes": None, "peak_rss_bytes": v} for v in (50, 50)]
    assert memory_peaks(cpu)["memory_imbalance_pct"] == 0.0
    assert memory_peaks([])["peak_memory_bytes"] is None
