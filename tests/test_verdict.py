"""Issue 27: the verdict's clauses and caveats, on copies of the session's real runs.

run.json `env.host_load` (issue 26's schema) is decoded typed; a run is busy when other processes
used more than 0.5 × its cores, and the verdict says so; without `host_load` it says nothing about
load. Few measured steps and superlinear efficiency are caveats too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from analysis.report.findings import THRESHOLDS
from analysis.report.verdict import verdict
from analysis.runs.compare import compare_runs


def _copy_with(run: Path, dest: Path, host_load: dict | None, steps: int | None = None) -> None:
    shutil.copytree(run, dest)
    rec = json.loads((dest / "run.json").read_text())
    # None: a record from before env.host_load (the real run measured this loaded machine's),
    # and steps.csv from before its per-step load (tests/test_quiet.py judges that one)
    rec["env"]["host_load"] = host_load
    rows = pd.read_csv(dest / "steps.csv")
    rows.drop(columns="other_cpu_cores").to_csv(dest / "steps.csv", index=False)
    if steps is not None:
        for r in rec["metrics"]["per_rank"]:
            r["steps"] = steps
    (dest / "run.json").write_text(json.dumps(rec))


def _text(entry: dict) -> str:
    return "".join(s["text"] for s in entry["segments"])


LOAD = {"load_avg_1m_start": 3.0, "load_avg_1m_end": 3.5, "steal_pct": None, "own_threads": 2}


def test_busy_machine_caveat_from_host_load(single_mlp_run, ddp_mlp_run, tmp_path):
    busy = {**LOAD, "other_cpu_cores_mean": 1.5, "cores": 2}  # 1.5 > 0.5 × 2
    _copy_with(single_mlp_run, tmp_path / "runs" / "single", busy)
    _copy_with(ddp_mlp_run, tmp_path / "runs" / "ddp", None)
    data = compare_runs([tmp_path / "runs"], progress=False, traces=False)
    single = next(r for r in data["runs"] if r["mode"] == "single")
    assert single["host_load"]["other_cpu_cores_mean"] == 1.5  # decoded, passed through
    (v,) = verdict(data)
    assert any(c.startswith("busy machine") and "1 of 2 runs" in c for c in v["caveats"])
    assert THRESHOLDS["busy_other_cores_frac"] == 0.5


def test_no_load_caveat_without_host_load_or_on_an_idle_machine(
    single_mlp_run, ddp_mlp_run, tmp_path
):
    idle = {**LOAD, "other_cpu_cores_mean": 0.9, "cores": 2}  # 0.9 ≤ 1.0: not busy
    _copy_with(single_mlp_run, tmp_path / "runs" / "single", idle)
    _copy_with(ddp_mlp_run, tmp_path / "runs" / "ddp", None)
    (v,) = verdict(compare_runs([tmp_path / "runs"], progress=False, traces=False))
    assert not any(c.startswith("busy") for c in v["caveats"])


def test_few_steps_caveat_and_the_verdict_quotes_the_group(single_mlp_run, ddp_mlp_run, tmp_path):
    _copy_with(single_mlp_run, tmp_path / "runs" / "single", None, steps=3)
    _copy_with(ddp_mlp_run, tmp_path / "runs" / "ddp", None, steps=20)
    data = compare_runs([tmp_path / "runs"], progress=False)
    (v,) = verdict(data)
    assert any(c.startswith("few steps: 1 runs") for c in v["caveats"])
    (g,) = [g for g in data["groups"] if g["mode"] == "ddp"]
    text = _text(v)
    assert text.startswith(f"DDP (gloo), 2 ranks: {g['speedup_mean']:.2f}× over single device")
    assert f"{g['comm_pct_mean']:.0f}% of the step" in text
    hrefs = {s["href"] for s in v["segments"] if s["href"]}
    assert {"#speedup", "#communication", "#efficiency"} <= hrefs
    superlinear = g["scaling_efficiency_mean"] > THRESHOLDS["efficiency_superlinear"]
    assert superlinear == any(c.startswith("superlinear") for c in v["caveats"])


def test_a_workload_without_a_parallel_run_says_what_to_run(single_mlp_run, tmp_path):
    _copy_with(single_mlp_run, tmp_path / "runs" / "single", None)
    (v,) = verdict(compare_runs([tmp_path / "runs"], progress=False, traces=False))
    assert "make profile-all" in _text(v)


def test_a_split_part_beyond_the_whole_loss_is_an_unstable_split_caveat(
    single_mlp_run, ddp_mlp_run, tmp_path
):
    _copy_with(single_mlp_run, tmp_path / "runs" / "single", None)
    _copy_with(ddp_mlp_run, tmp_path / "runs" / "ddp", None)
    data = compare_runs([tmp_path / "runs"], progress=False, traces=False)
    (g,) = [g for g in data["groups"] if g["mode"] == "ddp"]
    # The measured split moves with the machine's load, so the sane case is set by hand: the
    # whole loss in one part, every other part 0.
    loss = sum(x for x in g["efficiency_loss_pts"].values() if x is not None)
    g["efficiency_loss_pts"] = {k: 0.0 for k in g["efficiency_loss_pts"]} | {"exposed_comm": loss}
    (v,) = verdict(data)
    assert not any(c.startswith("unstable") for c in v["caveats"])
    # A slowed 1-rank DDP run (another job started) gives a DDP-cost part of 586 points that
    # contention offsets: the parts still sum to the loss, but neither part means anything.
    g["efficiency_loss_pts"] = {
        **g["efficiency_loss_pts"],
        "ddp_overhead": 585.9,
        "contention": -546.5,
    }
    (v,) = verdict(data)
    (caveat,) = [c for c in v["caveats"] if c.startswith("unstable")]
    assert "DDP's own per-step cost, compute contention beyond ±100 points" in caveat


def test_a_one_rank_ddp_group_is_not_called_superlinear(single_mlp_run, ddp_mlp_run, tmp_path):
    """The demo's 1-rank DDP run measures DDP's own cost: a ratio over 1.10 is noise, not scaling."""
    from analysis.report.findings import findings

    _copy_with(single_mlp_run, tmp_path / "runs" / "single", None)
    _copy_with(ddp_mlp_run, tmp_path / "runs" / "ddp", None)
    data = compare_runs([tmp_path / "runs"], progress=False, traces=False)
    (g,) = [g for g in data["groups"] if g["mode"] == "ddp"]

    def scaling() -> str:
        (f,) = [f for f in findings(data) if f.rule == "scaling"]
        return f.text

    g.update(speedup_mean=2.6, scaling_efficiency_mean=1.3)  # 2 ranks, superlinear
    (v,) = verdict(data)
    assert any(c.startswith("superlinear") for c in v["caveats"])
    assert "above linear" in scaling()
    g.update(world_size=1, speedup_mean=1.3)  # the same ratio at 1 rank
    (v,) = verdict(data)
    assert not any(c.startswith("superlinear") for c in v["caveats"])
    text = scaling()
    assert "on 1 rank reached 1.30×" in text and "DDP's own cost" in text
