"""The report's "Where the memory goes": built from the real single and 2-rank gloo DDP MLP runs,
its table, CSV and finding are checked against the runs JSON; DP's per-GPU finding (GPU-only
in practice) on a hand-built runs JSON."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from analysis.report.build import write_report
from analysis.report.memory_section import memory_findings, timeline_figure
from analysis.runs.compare import compare_runs
from analysis.runs.memory import floor_bytes
from tests.test_report import Page, same

MIB = 2**20
FIELDS = (
    "parameters_bytes",
    "gradients_bytes",
    "optimizer_state_bytes",
    "buffers_bytes",
    "ddp_buckets_bytes",
    "static_total_bytes",
    "forward_peak_bytes",
    "backward_peak_bytes",
    "optimizer_peak_bytes",
)


@pytest.fixture(scope="module")
def report(single_mlp_run, ddp_mlp_run, tmp_path_factory):
    data = compare_runs([single_mlp_run, ddp_mlp_run], progress=False)
    out = tmp_path_factory.mktemp("memreport")
    write_report(data, out, progress=False)
    return out, data, Page((out / "index.html").read_text(encoding="utf-8"))


@pytest.mark.integration
def test_breakdown_table_and_csv_match_the_runs_json(report) -> None:
    out, data, page = report
    assert page.section_of_table["memory_breakdown"] == "memory"
    with open(out / "memory_breakdown.csv", newline="") as f:
        csv_rows = {(r["run_id"], int(r["rank"])): r for r in csv.DictReader(f)}
    n = 0
    for run in data["runs"]:
        for e in run["memory_breakdown"]:
            row = page.row("memory_breakdown", run_id=run["run_id"], rank=e["rank"])
            for key in FIELDS:
                assert same(row[key][0], e[key]), (run["run_id"], key)
                assert int(csv_rows[(run["run_id"], e["rank"])][key]) == e[key]
            n += 1
    assert n == 3  # single rank 0, DDP ranks 0 and 1


@pytest.mark.integration
def test_finding_names_ddp_buckets(report) -> None:
    _, data, page = report
    single = next(r for r in data["runs"] if r["mode"] == "single")["memory_breakdown"][0]
    ddp = next(r for r in data["runs"] if r["mode"] == "ddp")["memory_breakdown"]
    diff = sum(e["static_total_bytes"] for e in ddp) / 2 - single["static_total_bytes"]
    assert diff == ddp[0]["ddp_buckets_bytes"] > 0
    want = (
        f"DDP (GLOO) holds {diff / MIB:.2f} MiB ({diff / single['gradients_bytes']:.1f}× gradients) "
        "more static memory per rank than Single: DDP's gradient buckets"
    )
    found = [f for f in page.findings if want in f]
    assert len(found) == 1 and "--gradient-as-bucket-view removes it" in found[0]
    summary = json.loads((Path(report[0]) / "summary.json").read_text())
    assert any(f["rule"] == "memory_breakdown" for f in summary["findings"])


@pytest.mark.integration
def test_memory_figures_are_embedded(report) -> None:
    _, _, page = report
    imgs = page.section_imgs["memory"]
    assert len(imgs) == 3 and all(s.startswith("data:image/svg+xml;base64,") for s in imgs)


def _dp_run() -> dict:
    """A DataParallel run on 2 GPUs as the runs JSON would hold it (numbers made up, but in the
    shape a GPU run records: everything static on cuda:0)."""
    entry = dict.fromkeys(FIELDS, 0)
    gpu0 = {**entry, "rank": 0, "device": "cuda:0", "parameters_bytes": 4 * MIB}
    gpu0.update(gradients_bytes=4 * MIB, optimizer_state_bytes=4 * MIB, static_total_bytes=12 * MIB)
    gpu0.update(forward_peak_bytes=3 * MIB, backward_peak_bytes=6 * MIB, optimizer_peak_bytes=MIB)
    gpu1 = {**entry, "rank": 0, "device": "cuda:1", "forward_peak_bytes": 2 * MIB}
    timeline = {"t_us": [0.0, 5.0, 10.0], "allocated_bytes": [8 * MIB, 11 * MIB, 8 * MIB]}
    devices = [
        {"device": d, "timeline": timeline, "start_level_bytes": 8 * MIB}
        for d in ("cuda:0", "cuda:1")
    ]
    phases = [{"phase": "forward", "start_us": 0.0, "end_us": 5.0}]
    return {
        "run_id": "dp-run",
        "status": "ok",
        "mode": "dp",
        "memory_breakdown": [gpu0, gpu1],
        "trace": {"ranks": [{"rank": 0, "memory": {"devices": devices, "phases": phases}}]},
    }


def test_dp_finding_explains_gpu0() -> None:
    (f,) = memory_findings({"runs": [_dp_run()]})
    assert f.text.startswith("DP keeps 12 MiB more static memory on cuda:0 than on any other")
    assert "parameters 4.00 MiB, gradients 4.00 MiB, optimizer state 4.00 MiB" in f.text
    assert "Forward peak: 3.00 MiB on cuda:0 vs 2.00 MiB on the others" in f.text
    assert timeline_figure({"runs": [_dp_run()]}, {}).startswith("data:image/svg+xml;base64,")


def test_static_floor_rule() -> None:
    e = {"static_total_bytes": 100, "gradients_bytes": 30, "ddp_buckets_bytes": 30}
    assert floor_bytes(e, "single") == 70  # set_to_none frees the gradients between steps
    assert floor_bytes(e, "ddp") == 70  # DDP's own buckets stay (in the total), grads go
    assert floor_bytes({**e, "ddp_buckets_bytes": 0}, "ddp") == 100  # grads are bucket views
    assert floor_bytes({"static_total_bytes": None, "gradients_bytes": 1}, "ddp") is None


def test_seeds_with_the_same_numbers_give_one_finding() -> None:
    runs = []
    for seed in (0, 1):
        a, b = _dp_run(), _dp_run()
        a["run_id"], b["run_id"] = f"dp-s{seed}", f"dp-other-s{seed}"
        runs += [a, b]
    (f,) = memory_findings({"runs": runs})
    assert f.run_ids == ["dp-s0", "dp-other-s0", "dp-s1", "dp-other-s1"]


@pytest.mark.integration
def test_ddp_finding_needs_a_single_run_of_the_same_workload(report) -> None:
    """The DDP-vs-single finding pairs runs by the one same-workload key (WORKLOAD_KEY): a single
    run of another amp, OS or device type is no baseline (issue 8's shared key)."""
    data = report[1]
    vs_single = [f for f in memory_findings(data) if "Single" in f.text]
    assert vs_single  # the recorded single and DDP runs are one workload: they pair
    for key, other in (("amp", "bf16-other"), ("os", "OtherOS"), ("device_type", "cuda")):
        moved = json.loads(json.dumps(data))
        for run in moved["runs"]:
            if run["mode"] == "single":
                run[key] = other
        assert [f for f in memory_findings(moved) if "Single" in f.text] == [], key
