"""Issue 34 (a report that only renders): the runs JSON reads back typed (analysis.runs.runsjson)
with nothing lost, its entries keep the typed entries' field order, the report's entry points
take the dict and the typed form alike, and a runs JSON of the wrong shape is one line."""

from __future__ import annotations

import json
import shutil

import msgspec
import pytest

from analysis.report.build import ReportError, write_report
from analysis.report.findings import findings
from analysis.report.tune import tune_header
from analysis.report.verdict import verdict
from analysis.runs.compare import compare_runs
from analysis.runs.entry import RunEntry
from analysis.runs.groups import GroupEntry
from analysis.runs.runsjson import RunsJsonError, read_runs_json
from analysis.runs.tune import TuneEntry

FRAGMENT = {  # a hand-built runs JSON: only the fields the rules read (the rest reads as empty)
    "runs": [
        {"run_id": "s0", "status": "ok", "mode": "single", "world_size": 1, "samples_per_s": 100.0,
         "eval_note": "no test split"},
        {"run_id": "d0", "status": "failed", "mode": "ddp", "world_size": 2,
         "error": {"kind": "oom", "message": "CUDA out of memory\nmore"}},
    ],
    "groups": [
        {"mode": "single", "world_size": 1, "run_ids": ["s0"], "samples_per_s_mean": 100.0},
        {"mode": "ddp", "backend": "gloo", "world_size": 2, "run_ids": ["d1"],
         "samples_per_s_mean": 150.0, "speedup_mean": 1.5, "scaling_efficiency_mean": 0.75},
    ],
}  # fmt: skip


def test_the_dict_and_its_typed_reading_give_the_same_findings_and_verdict():
    typed = read_runs_json(FRAGMENT)
    assert isinstance(typed.runs[0], RunEntry) and isinstance(typed.groups[1], GroupEntry)
    assert typed.runs[0].model_args == "" and typed.runs[0].loss == "cross_entropy"  # defaults
    assert findings(FRAGMENT) == findings(typed)
    assert verdict(FRAGMENT) == verdict(typed)
    texts = [f.text for f in findings(typed)]
    assert any(t.startswith("DDP (GLOO) on 2 ranks reached 1.50× vs single (75%") for t in texts)
    assert "1 run is failed: oom: CUDA out of memory\nmore" in texts
    assert "No eval in 1 run(s), so no accuracy to compare: no test split." in texts


def test_a_runs_json_of_the_wrong_shape_is_one_line_and_writes_nothing(tmp_path):
    bad = {"runs": [{"run_id": "a", "status": "ok", "world_size": "two"}]}
    with pytest.raises(RunsJsonError) as err:
        read_runs_json(bad)
    assert "$.runs[0].world_size" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ReportError, match=r"runs\[0\]\.world_size"):
        write_report(bad, tmp_path / "report", progress=False)
    assert not (tmp_path / "report").exists()


@pytest.mark.integration
def test_typed_entries_hold_exactly_what_the_runs_json_holds(
    tmp_path, single_mlp_run, ddp_mlp_run, comm_run
):
    """Every run, group and tune entry reads back field for field, in the typed entries' field
    order (the runs JSON is those entries written out); reading changes nothing of the JSON."""
    for d in (single_mlp_run, ddp_mlp_run, comm_run):
        shutil.copytree(d, tmp_path / "runs" / d.name)
    tune = {"tune_id": "t", "workload": {"model": "mlp"}, "status": "ok",
            "baseline": {"name": "baseline", "trials": [{"status": "ok"}]},
            "candidates": [{"name": "bucket-1", "speedup_vs_baseline": 1.02, "args": ["--x"]}]}  # fmt: skip
    (tmp_path / "runs" / "tune-t").mkdir()
    (tmp_path / "runs" / "tune-t" / "tune.json").write_text(json.dumps(tune))
    data = compare_runs([tmp_path / "runs"], progress=False)
    before = json.dumps(data)
    doc = read_runs_json(data)
    for key, struct in (("runs", RunEntry), ("groups", GroupEntry), ("tunes", TuneEntry)):
        assert data[key], key
        assert msgspec.to_builtins(getattr(doc, key)) == data[key], key
        names = [f.name for f in msgspec.structs.fields(struct)]
        assert all(list(entry) == names for entry in data[key]), key
    assert json.dumps(data) == before
    (proj,) = doc.projections
    assert proj.run_id == "single-mlp" and proj.replays[0].run_id == "ddp-gloo-mlp"
    assert [a.b.run_id for a in doc.ddp_adds] == ["ddp-gloo-mlp"]
    summary = json.loads(
        write_report(data, tmp_path / "report", progress=False).summary_json.read_text()
    )
    assert {k: summary[k] for k in data} == json.loads(before)


def test_a_tune_header_shows_what_its_tune_json_holds_and_leaves_out_the_rest():
    """A tune.json with only `workload.model` (all `load_tune` requires) still renders."""
    bare = TuneEntry(tune_id="t", status="ok", workload={"model": "mlp"})
    assert tune_header(bare) == "mlp · status ok"
    full = TuneEntry(
        status="ok",
        workload={"model": "mlp", "dataset": "digits", "batch_size": 64, "nproc": 2,
                  "backend": "gloo", "device": "cpu", "steps": 20, "trials": 3, "args": ["--x"]},
        rules={"alpha": 0.1, "loss_tolerance": 0.001},
    )  # fmt: skip
    assert tune_header(full) == (
        "mlp · digits · global batch 64 · 2 × gloo on cpu · 20 steps per trial · 3 trials per arm"
        " · ARGS --x · significance level 0.1 · loss flag above 0.001 nats · status ok"
    )
    no_device = TuneEntry(workload={"model": "mlp", "nproc": 2, "backend": "gloo"})
    assert tune_header(no_device) == "mlp"  # no device, no status: those pieces are left out
