"""Finding rules on the cases a CPU machine cannot produce (DP on 2 GPUs, NCCL vs GLOO, an accuracy
drop), fed runs-JSON fragments with only the fields each rule reads; the end-to-end report over
real runs is in test_report.py."""

from __future__ import annotations

from analysis.report.findings import THRESHOLDS, findings
from analysis.runs.fields import memory_peaks

GIB = 2**30


def group(mode, backend, *, sps, top1, speedup=None, ws=2, run_ids=()):
    return {
        "model": "resnet18",
        "dataset": "cifar10",
        "scaling": "strong",
        "os": "Linux",
        "mode": mode,
        "backend": backend,
        "world_size": ws,
        "samples_per_s_mean": sps,
        "speedup_mean": speedup,
        "scaling_efficiency_mean": speedup / ws if speedup else None,
        "top1_pct_mean": top1,
        "run_ids": list(run_ids),
    }


def dp_run(alloc0, alloc1):
    memory = [
        {"rank": 0, "device": "cuda:0", "peak_allocated_bytes": alloc0},
        {"rank": 0, "device": "cuda:1", "peak_allocated_bytes": alloc1},
    ]
    return {
        "run_id": "dp0",
        "status": "ok",
        "mode": "dp",
        "backend": "none",
        "world_size": 2,
        "model": "resnet18",
        "exposed_comm_pct": None,
        "memory": memory,
        **memory_peaks(
            memory
        ),  # memory_metric and the imbalance numbers, as compare_runs writes them
    }


def texts(data):
    return [f.text for f in findings(data)]


def test_dp_memory_imbalance_names_devices_and_threshold():
    data = {
        "runs": [dp_run(int(1.38 * GIB), GIB)],
        "groups": [group("dp", "none", sps=900, top1=70, speedup=1.2, ws=2, run_ids=["dp0"])],
    }
    out = texts(data)
    assert (
        "DP holds 38% more memory on cuda:0 than on cuda:1 (peak allocated; imbalance threshold 10%)."
        in out
    )
    assert any(t.startswith("DP on 2 devices reached 1.20× vs single (60% efficiency") for t in out)


def test_memory_under_threshold_is_balanced():
    data = {
        "runs": [dp_run(int(1.05 * GIB), GIB)],
        "groups": [group("dp", "none", sps=900, top1=70, speedup=1.9, run_ids=["dp0"])],
    }
    mem = [t for t in texts(data) if "memory" in t]
    assert mem == [
        "DP on 2 devices: memory is balanced (peak allocated differs by 5%; the threshold is 10%)."
    ]


def test_backends_accuracy_and_scaling_verdicts():
    groups = [
        group("single", "none", sps=1000, top1=80.0),
        group("ddp", "nccl", sps=1900, top1=79.5, speedup=1.9),
        group("ddp", "gloo", sps=900, top1=77.0, speedup=0.9),
    ]
    out = texts({"runs": [], "groups": groups})
    assert "Backends: NCCL 2.1× faster than GLOO on the same run" in " ".join(out)
    assert any(
        "DDP (GLOO) on 2 ranks lost accuracy vs single: top-1 77.0% vs 80.0%" in t
        and "SyncBatchNorm / lr scaling" in t
        for t in out
    )
    assert any(t.startswith("DDP (NCCL) on 2 ranks held accuracy") for t in out)
    nccl = next(
        f
        for f in findings({"runs": [], "groups": groups})
        if "DDP (NCCL) on 2 ranks reached" in f.text
    )
    assert nccl.severity == "good" and "95% efficiency: good scaling" in nccl.text
    gloo = next(
        f
        for f in findings({"runs": [], "groups": groups})
        if "DDP (GLOO) on 2 ranks reached" in f.text
    )
    assert gloo.severity == "bad" and "poor scaling" in gloo.text  # slower than single


def test_thresholds_are_the_ones_the_text_states():
    eff = THRESHOLDS["efficiency_good"]
    groups = [
        group("single", "none", sps=1000, top1=80.0),
        group("ddp", "gloo", sps=1600, top1=80.0, speedup=2 * eff),
    ]
    text = next(t for t in texts({"runs": [], "groups": groups}) if "reached" in t)
    assert f"{eff * 100:.0f}% efficiency: good scaling" in text  # the boundary counts as good


def test_superlinear_efficiency_is_a_warning_not_praise():
    """269% efficiency on 2 CPU ranks (seen when the single baseline shared the cores with other
    work) must not read as "good scaling"."""
    limit = THRESHOLDS["efficiency_superlinear"]
    groups = [
        group("single", "none", sps=200, top1=80.0, run_ids=["s0"]),
        group("ddp", "gloo", sps=1076, top1=80.0, speedup=5.38, run_ids=["d0"]),
        group("ddp", "nccl", sps=440, top1=80.0, speedup=2 * limit, run_ids=["n0"]),
    ]
    found = findings({"runs": [], "groups": groups})
    gloo = next(f for f in found if f.text.startswith("DDP (GLOO) on 2 ranks reached"))
    assert gloo.severity == "warn" and "good scaling" not in gloo.text
    assert "269% efficiency: above linear;" in gloo.text
    assert (
        f"over {limit * 100:.0f}% usually means the single-device baseline was slowed" in gloo.text
    )
    assert "re-measure" in gloo.text
    nccl = next(f for f in found if f.text.startswith("DDP (NCCL) on 2 ranks reached"))
    assert nccl.severity == "good" and "good scaling" in nccl.text  # the boundary is still good


def test_accuracy_findings_name_their_runs_and_dp_devices():
    groups = [
        group("single", "none", sps=1000, top1=80.0, run_ids=["s0", "s1"]),
        group("dp", "none", sps=1500, top1=80.0, speedup=1.5, run_ids=["dp0"]),
    ]
    (acc,) = [f for f in findings({"runs": [], "groups": groups}) if f.rule == "accuracy"]
    assert acc.text.startswith("DP on 2 devices held accuracy") and acc.run_ids == [
        "dp0",
        "s0",
        "s1",
    ]


def test_the_family_is_compared_member_with_member():
    """Issue 30: a ZeRO-1 group on gloo is not DDP's gloo side of the backend comparison, and
    its exposed communication is not called allreduce."""
    single = group("single", "none", sps=1000, top1=80.0)
    ddp_nccl = {**group("ddp", "nccl", sps=1900, top1=80.0, speedup=1.9), "strategy": "ddp"}
    zero_gloo = {**group("ddp", "gloo", sps=900, top1=80.0, speedup=0.9), "strategy": "zero1"}
    out = " ".join(texts({"runs": [], "groups": [single, ddp_nccl, zero_gloo]}))
    assert "Backends:" not in out and "ZeRO-1 (GLOO) on 2 ranks reached 0.90×" in out
    zero_nccl = {**zero_gloo, "backend": "nccl", "samples_per_s_mean": 1800}
    out = " ".join(texts({"runs": [], "groups": [single, ddp_nccl, zero_gloo, zero_nccl]}))
    assert "Backends: NCCL 2.0× faster than GLOO on the same run (resnet18, ZeRO-1, 2" in out
