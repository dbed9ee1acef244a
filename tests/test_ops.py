"""`analysis ops` / `analysis diff` on real run folders (conftest's single and 2-rank gloo DDP MLP
runs), hand-built nesting for the self-time rule, and bad input."""

from __future__ import annotations

import json
import shutil

import pytest

from analysis.cli.main import main
from analysis.runs.compare import compare_runs
from analysis.runs.opdiff import diff_runs
from analysis.trace.folder import analyze_trace_dir
from analysis.trace.ops import kernel_key
from tests.conftest import read_run

PINNED = {
    "name",
    "calls_per_step_a",
    "calls_per_step_b",
    "self_us_per_step_a",
    "self_us_per_step_b",
    "delta_us_per_step",
    "status",
}


@pytest.mark.parametrize("fixture", ["single_mlp_run", "ddp_mlp_run"])
@pytest.mark.integration
def test_self_times_add_up_to_at_most_the_step(fixture, request):
    run = request.getfixturevalue(fixture)
    for r in analyze_trace_dir(run / "traces", progress=False)["ranks"]:
        ops, t = r["ops"], r["ops_self_us_per_step"]
        assert ops and t["gpu"] == 0
        # The training thread's ops nest inside ProfilerStep: their self times tile part of it.
        assert 0 < t["training_thread"] <= r["step_time_us_mean"]
        cpu_self = sum(o["self_us_per_step"] for o in ops)
        assert cpu_self == pytest.approx(t["training_thread"] + t["other_threads"])
        for o in ops:
            assert 0 <= o["self_us_per_step"] <= o["total_us_per_step"] + 1e-6, o
            assert o["calls_per_step"] > 0
            assert o["pct_of_step"] == pytest.approx(
                100 * o["self_us_per_step"] / r["step_time_us_mean"]
            )
        assert not {"forward", "backward", "optimizer", "data"} & {o["name"] for o in ops}


def test_ddp_adds_one_gloo_all_reduce_per_bucket(single_mlp_run, ddp_mlp_run, tmp_path):
    buckets = read_run(ddp_mlp_run)["metrics"]["ddp"]["num_buckets"]
    out = tmp_path / "diff.json"
    assert main(["diff", str(single_mlp_run), str(ddp_mlp_run), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["warnings"] == []  # same workload: DDP vs single of one global batch
    assert result["a"]["run_id"] == "single-mlp" and result["b"]["run_id"] == "ddp-gloo-mlp"
    rows = {r["name"]: r for r in result["ops"]}
    assert all(PINNED <= r.keys() for r in result["ops"])
    ar = rows["gloo:all_reduce"]
    assert ar["status"] == "new" and ar["calls_per_step_a"] == 0
    assert ar["calls_per_step_b"] == buckets
    assert ar["delta_us_per_step"] == pytest.approx(ar["self_us_per_step_b"])
    assert rows["aten::addmm"]["status"] == "both"  # the model's three Linear layers, both sides
    assert rows["aten::addmm"]["calls_per_step_a"] == rows["aten::addmm"]["calls_per_step_b"] == 3
    for r in result["ops"]:
        present = (r["calls_per_step_a"] > 0, r["calls_per_step_b"] > 0)
        assert (
            present
            == {"both": (True, True), "new": (False, True), "gone": (True, False)}[r["status"]]
        )
    deltas = [abs(r["delta_us_per_step"]) for r in result["ops"]]
    assert deltas == sorted(deltas, reverse=True)
    # Per-device batches differ (64 vs 32): per-sample columns are there.
    assert result["per_sample"] and ar["self_us_per_sample_b"] == pytest.approx(
        ar["self_us_per_step_b"] / 32
    )
    (coll,) = result["collectives"]
    assert coll["name"] == "gloo:all_reduce" and coll["status"] == "new"
    assert coll["calls_per_step_b"] == buckets
    assert {p["phase"] for p in result["phases"]} >= {"forward", "backward", "step_time"}


def test_runs_json_carries_what_ddp_adds(single_mlp_run, ddp_mlp_run, tmp_path):
    """The runs JSON's `ddp_adds` (what the report's "What DDP adds" renders) is the very diff
    `analysis diff SINGLE DDP` computes on its own: one per DDP group, A = its single baseline."""
    # Both runs sit in one folder, so the paths in the diff's sides match compare_runs' too.
    shutil.copytree(single_mlp_run, tmp_path / "single-mlp")
    shutil.copytree(ddp_mlp_run, tmp_path / "ddp-gloo-mlp")
    result = compare_runs([tmp_path], progress=False)
    (adds,) = result["ddp_adds"]
    assert adds == diff_runs(tmp_path / "single-mlp", tmp_path / "ddp-gloo-mlp")
    assert adds["a"]["run_id"] == "single-mlp" and adds["b"]["rank"] == 0
    assert compare_runs([tmp_path], progress=False, traces=False)["ddp_adds"] == []


def test_ops_cli_top_and_json(ddp_mlp_run, tmp_path, capsys):
    out = tmp_path / "ops.json"
    assert main(["ops", str(ddp_mlp_run), "--top", "5", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    for r in result["ranks"]:
        assert len(r["ops"]) == 5
        assert set(r["ops"][0]) >= {
            "name",
            "calls_per_step",
            "self_us_per_step",
            "total_us_per_step",
            "pct_of_step",
        }
    assert "gloo:all_reduce" in capsys.readouterr().out


def test_run_without_traces_is_one_line(ddp_mlp_run, tmp_path, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(ddp_mlp_run, bare, ignore=shutil.ignore_patterns("traces"))
    for argv in (["ops", str(bare)], ["diff", str(ddp_mlp_run), str(bare)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "has no traces" in err and str(bare) in err, err
    assert main(["ops", str(ddp_mlp_run.parent)]) == 2  # the runs folder, not one run
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is a folder of runs" in err, err


def test_different_workloads_warn_naming_the_difference(single_mlp_run, tmp_path):
    other = tmp_path / "single-b32"  # the same model and data, half the batch
    shutil.copytree(single_mlp_run, other)
    rec = read_run(other)
    rec["run_id"] = other.name
    rec["config"].update(global_batch=32, per_device_batch=32, micro_batch=32)
    (other / "run.json").write_text(json.dumps(rec))
    result = diff_runs(single_mlp_run, other)
    (warning,) = result["warnings"]
    assert "different workloads" in warning and "global batch 64 vs 32" in warning
    assert result["per_sample"]  # 64 vs 32 samples per step


def test_self_time_by_hand(tmp_path):
    """Thread 1: parent 0-100 holds children 10-30 and 40-50 (which holds 42-45); thread 2's
    gloo call 20-90 is on its own timeline. One step 0-200."""

    def op(name, ts, dur, tid=1, cat="cpu_op"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}

    events = [
        op("ProfilerStep#1", 0, 200, cat="user_annotation"),
        op("ProfilerStep#2", 200, 10, cat="user_annotation"),
        op("backward", 0, 150, cat="user_annotation"),  # a range, not an operator
        op("parent", 0, 100),
        op("child", 10, 20),
        op("child", 40, 10),
        op("grandchild", 42, 3),
        op("gloo:all_reduce", 20, 70, tid=2, cat="user_annotation"),
    ]
    (tmp_path / "rank0.pt.trace.json").write_text(json.dumps({"traceEvents": events}))
    (r,) = analyze_trace_dir(tmp_path, progress=False)["ranks"]
    got = {o["name"]: (o["calls_per_step"], o["self_us_per_step"], o["total_us_per_step"]) for o in r["ops"]}  # fmt: skip
    assert got == {
        "parent": (1, 70, 100),
        "child": (2, 27, 30),
        "grandchild": (1, 3, 3),
        "gloo:all_reduce": (1, 70, 70),
    }
    assert r["ops_self_us_per_step"] == {"training_thread": 100, "other_threads": 70, "gpu": 0}


def test_kernel_names_are_normalised():
    assert kernel_key("void at::native::k<float, 4>(float*, int, at::Array<char*, 3>)") == (
        "void at::native::k<float, 4>"
    )
    assert kernel_key("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long)") == (
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    )
    assert kernel_key("Memcpy HtoD (Pinned -> Device)") == "Memcpy HtoD"
    assert kernel_key("kernel at 0x7f00aa") == "kernel at 0x?"
    assert kernel_key("sgemm_128x64_nn") == "sgemm_128x64_nn"
