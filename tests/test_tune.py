"""Issue 10: `make tune-ddp` (workloads.tools.tune). Real trials through the real launcher (torchrun,
gloo), kept tiny: the MLP, 6 steps, TRIALS=1 and a restricted candidate list. The statistics are
checked against scipy (an independent implementation) and against numbers recomputed here from
the trial run folders; nothing is timed."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from scipy.stats import mannwhitneyu

from analysis.report.build import write_report
from analysis.runs.compare import compare_runs
from workloads.tools import tune_stats
from workloads.tools.tune import main as tune_main

TINY = "--model mlp --dataset synthetic --batch-size 64 --max-steps 6 --device cpu --nproc 2"
TINY += " --backend gloo --no-progress"


@dataclass
class Tuned:
    """What one tune printed and its exit code."""

    returncode: int
    stdout: str
    stderr: str


def run_tune(args: list[str]) -> Tuned:
    """`python -m workloads.tools.tune TINY ARGS` in this process (every trial is still a real
    launcher, torchrun and its ranks)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = tune_main([*TINY.split(), *args])
    return Tuned(code, out.getvalue(), err.getvalue())


# --- statistics (pure) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cand", "base"),
    [
        ([3.0, 4.0, 5.0], [1.0, 2.0, 2.5]),  # complete separation: the smallest 3+3 p
        ([1.0, 4.0, 5.0], [2.0, 3.0, 2.5]),
        ([1.1, 0.9], [1.0, 1.05, 0.95, 1.2]),
        ([2.0, 3.0, 4.0, 5.0, 6.0], [1.0, 1.5, 2.5, 0.5, 0.7]),
    ],
)
def test_mann_whitney_p_matches_scipy_exact(cand, base):
    expected = mannwhitneyu(cand, base, method="exact", alternative="two-sided").pvalue
    assert tune_stats.mann_whitney_p(cand, base) == pytest.approx(expected, abs=1e-12)


def test_compare_needs_every_trial_beyond_the_noise_at_three_trials():
    base = [100.0, 104.0, 98.0]
    faster = tune_stats.compare([110.0, 108.0, 112.0], base)
    assert faster["p_value"] == pytest.approx(0.1) and faster["significant"]
    assert faster["speedup_vs_baseline"] == pytest.approx(110.0 / 100.0)
    assert (faster["speedup_min"], faster["speedup_max"]) == pytest.approx((1.08, 1.12))
    overlapping = tune_stats.compare([110.0, 99.0, 112.0], base)
    assert not overlapping["significant"] and overlapping["p_value"] > 0.1
    one_trial = tune_stats.compare([150.0], [100.0])  # TRIALS=1 can never be significant
    assert one_trial["p_value"] == 1.0 and not one_trial["significant"]
    assert tune_stats.compare([], base)["speedup_vs_baseline"] is None


def test_greedy_order_takes_the_best_of_each_group_that_helped():
    def arm(name, group, speedup, significant=True, flagged=False):
        return {"name": name, "group": group, "speedup_vs_baseline": speedup,
                "significant": significant, "loss_flagged": flagged}  # fmt: skip

    arms = [
        arm("bucket-1", "bucket", 1.05),
        arm("bucket-100", "bucket", 1.10),
        arm("static-graph", "static-graph", 1.20),
        arm("fp16", "comm-hook", 1.30),
        arm("powersgd", "comm-hook", 1.60, flagged=True),  # changes training: never combined
        arm("bf16", "comm-hook", 1.40, significant=False),
        arm("grad-as-bucket-view", "grad-as-bucket-view", 0.90),  # slower
    ]
    assert [a["name"] for a in tune_stats.greedy_order(arms)] == [
        "bucket-100",
        "fp16",
        "static-graph",
    ]
    assert tune_stats.loss_max_abs_diff({0: 1.0, 1: 2.0, 2: 3.0}, {1: 2.5, 2: 3.0}) == 0.5


def _measured(name: str, args: list[str], trials: list[float], base: list[float], **extra) -> dict:
    """An arm as the tuner holds it after its trials: `compare` over its samples/s trials and
    the baseline trials interleaved with it (hand-built numbers, the real statistics)."""
    return {"name": name, "args": args, "lossy": False, **tune_stats.compare(trials, base), **extra}


BASE = [100.0, 101.0, 99.0]


def _single(name: str, group: str, trials: list[float], *, loss_flagged: bool = False) -> dict:
    return _measured(name, [f"--{name}"], trials, BASE, group=group, loss_flagged=loss_flagged)


def test_greedy_combination_keeps_a_combination_only_when_significantly_better():
    bucket = _single("bucket-100", "bucket", [110.0, 111.0, 109.0])  # 1.10, p = 0.10
    static = _single("static-graph", "static-graph", [120.0, 121.0, 119.0])  # 1.20, p = 0.10
    lossy = _single("powersgd", "comm-hook", [150.0, 151.0, 149.0], loss_flagged=True)
    order = tune_stats.greedy_order([bucket, static, lossy])
    assert [a["name"] for a in order] == ["bucket-100", "static-graph"]  # the flagged knob: never

    def measure_with(results: dict[str, tuple[list[float], list[float]]]):
        """`measure` over hand-built combination trials: name -> (its trials, its baseline's)."""
        asked: list[tuple[dict, int]] = []

        def measure(spec: dict, step: int) -> tuple[dict, bool]:
            asked.append((spec, step))
            trials, base = results[spec["name"]]
            return _measured(spec["name"], spec["args"], trials, base, loss_flagged=False), False

        return measure, asked

    # Significant and faster than bucket-100 alone: the combination is kept.
    measure, asked = measure_with({"bucket-100+static-graph": ([130.0, 131.0, 129.0], BASE)})
    best = tune_stats.greedy_combine(order, measure)
    assert best["name"] == "bucket-100+static-graph"
    assert best["args"] == ["--bucket-100", "--static-graph"]
    assert [(s["name"], step) for s, step in asked] == [("bucket-100+static-graph", 1)]
    # Faster on the median but overlapping its baseline (not significant): not kept.
    noisy = ([130.0, 98.0, 135.0], BASE)
    measure, _ = measure_with({"bucket-100+static-graph": noisy})
    assert tune_stats.greedy_combine(order, measure)["name"] == "bucket-100"
    # Significant but slower than the current best: not kept.
    measure, _ = measure_with({"bucket-100+static-graph": ([105.0, 106.0, 104.0], BASE)})
    assert tune_stats.greedy_combine(order, measure)["name"] == "bucket-100"
    # Nothing helped: no best, nothing measured.
    assert tune_stats.greedy_combine([], measure) is None


def test_keep_combination_and_what_a_combination_is():
    current = {"name": "a", "args": ["--a"], "lossy": False, "speedup_vs_baseline": 1.1}
    combo = {"speedup_vs_baseline": 1.2, "significant": True, "loss_flagged": False}
    assert tune_stats.keep_combination(combo, current)
    assert not tune_stats.keep_combination({**combo, "loss_flagged": True}, current)
    assert not tune_stats.keep_combination({**combo, "significant": False}, current)
    assert not tune_stats.keep_combination({**combo, "speedup_vs_baseline": 1.1}, current)
    assert not tune_stats.keep_combination({**combo, "speedup_vs_baseline": None}, current)
    knob = {"name": "fp16", "args": ["--comm-hook", "fp16"], "lossy": True}
    assert tune_stats.combination(current, knob) == {
        "name": "a+fp16",
        "args": ["--a", "--comm-hook", "fp16"],
        "lossy": True,
    }


def test_greedy_combination_stops_when_the_budget_runs_out():
    order = [
        _single(name, name, [100.0 + s, 101.0 + s, 99.0 + s])
        for name, s in (("a", 30.0), ("b", 20.0), ("c", 10.0))
    ]

    def run_out_during_the_first(trials: list[float]):
        asked: list[str] = []

        def measure(spec: dict, step: int) -> tuple[dict, bool]:
            asked.append(spec["name"])
            combo = _measured(spec["name"], spec["args"], trials, BASE, loss_flagged=False)
            return combo, True  # the budget ran out during this combination's trials

        return tune_stats.greedy_combine(order, measure), asked

    # Its three trials all beat the baseline: still judged (kept), and a+b+c is never tried.
    best, asked = run_out_during_the_first([140.0, 141.0, 139.0])
    assert asked == ["a+b"] and best["name"] == "a+b"
    # Cut short at one trial: not significant, so the best single knob stays; still no a+b+c.
    best, asked = run_out_during_the_first([140.0])
    assert asked == ["a+b"] and best["name"] == "a"


def test_budget_stop_reason_uses_the_median_trial_so_far():
    assert tune_stats.budget_stop_reason(50.0, [], 60.0) is None  # the first trial always runs
    assert tune_stats.budget_stop_reason(500.0, [10.0], 0.0) is None  # no budget
    # Median of 5, 30, 12 is 12: 45 + 12 = 57 fits in 60, 50 + 12 = 62 does not.
    assert tune_stats.budget_stop_reason(45.0, [5.0, 30.0, 12.0], 60.0) is None
    reason = tune_stats.budget_stop_reason(50.0, [5.0, 30.0, 12.0], 60.0)
    assert reason == "TUNE_BUDGET_S=60 s reached: the next trial (about 12 s) would end after it"


# --- bad input: one line, exit 2, nothing written ------------------------------------------


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--trials", "0"], "TRIALS (--trials) must be >= 1"),
        (["--candidates", ","], "TUNE_CANDIDATES (--candidates) is empty"),
        (["--candidates", "bucket-7"], "unknown bucket-7; pick from bucket-1"),
        (["--candidates", "accum-4", "--batch-size", "4"], "no candidate can run"),
        (["--backend", "nccl", "--device", "cpu"], "--backend nccl"),
        (["--bogus", "1"], "ARGS: unknown option(s) --bogus 1"),
    ],
)
@pytest.mark.integration
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, match):
    argv = ["--model", "mlp", "--nproc", "2", "--runs-dir", str(tmp_path / "runs"), *args]
    assert tune_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.count("\n") == 0
        and match in err
        and err.startswith("python -m workloads.tools.tune: error:")
    )
    assert not (tmp_path / "runs").exists()


# --- real tunes ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tune_dir(tmp_path_factory) -> Path:
    """Baseline + bucket-1 + powersgd, one trial each; a tolerance low enough that PowerSGD's
    rank-1 compression is flagged while a bucket size (same arithmetic) is not."""
    runs = tmp_path_factory.mktemp("tune-runs")
    proc = run_tune(
        ["--trials", "1", "--candidates", "bucket-1,powersgd", "--loss-tolerance", "1e-4",
         "--runs-dir", str(runs), "--tune-id", "tune-t"]
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (runs / "stdout.txt").write_text(proc.stdout)
    return runs / "tune-t"


def _global_loss(run_dir: Path) -> pd.Series:
    return pd.read_csv(run_dir / "steps.csv").groupby("step")["loss"].mean()


@pytest.mark.integration
def test_tune_json_holds_every_trial_and_numbers_recomputable_from_them(tune_dir):
    rec = json.loads((tune_dir / "tune.json").read_text())
    assert rec["status"] == "ok" and not rec["stopped_early"]
    assert rec["workload"]["model"] == "mlp" and rec["workload"]["nproc"] == 2
    names = [c["name"] for c in rec["candidates"]]
    assert names == ["bucket-1", "powersgd"]
    base_run = json.loads((tune_dir / "baseline-t1" / "run.json").read_text())
    assert base_run["config"]["profile"]["enabled"] is False
    base_sps = base_run["metrics"]["samples_per_s"]
    assert rec["baseline"]["samples_per_s_runs"] == [base_sps]
    for cand, (key, value) in zip(
        rec["candidates"], [("bucket_cap_mb", 1.0), ("comm_hook", "powersgd")], strict=True
    ):
        for field in ("name", "args", "samples_per_s_runs", "samples_per_s_median",
                      "speedup_vs_baseline", "significant", "loss_max_abs_diff"):  # fmt: skip
            assert field in cand
        run = json.loads((tune_dir / f"{cand['name']}-t1" / "run.json").read_text())
        assert run["status"] == "ok" and run["config"]["ddp"][key] == value
        assert cand["samples_per_s_runs"] == [run["metrics"]["samples_per_s"]]
        assert cand["speedup_vs_baseline"] == pytest.approx(
            run["metrics"]["samples_per_s"] / base_sps
        )
        assert cand["significant"] is False  # one trial per arm cannot beat the noise
        diff = (
            (_global_loss(tune_dir / f"{cand['name']}-t1") - _global_loss(tune_dir / "baseline-t1"))
            .abs()
            .max()
        )
        assert cand["loss_max_abs_diff"] == pytest.approx(diff, abs=1e-9)  # fmt: skip
    bucket, powersgd = rec["candidates"]
    assert bucket["loss_max_abs_diff"] < 1e-5 and not bucket["loss_flagged"]
    assert powersgd["loss_max_abs_diff"] > 1e-4 and powersgd["loss_flagged"]
    assert rec["best"] is None  # nothing significant: keep the workload as it is
    assert rec["command"].startswith(
        "make profile-ddp MODEL=mlp DATASET=synthetic BATCH=64 NPROC=2"
    )
    out = (tune_dir.parent / "stdout.txt").read_text()
    assert "bucket-1" in out and "powersgd" in out and "FLAG" in out and "command:" in out


def test_report_shows_the_tuning_section_without_the_trial_runs(tune_dir, single_mlp_run, tmp_path):
    data = compare_runs([tune_dir.parent, single_mlp_run.parent], progress=False, traces=False)
    assert [t["tune_id"] for t in data["tunes"]] == ["tune-t"]
    assert not any("tune-t" in r["path"] for r in data["runs"])  # trials stay out of the comparison
    assert not any("tune-t" in s["path"] for s in data["skipped"])
    alone = compare_runs(
        [tune_dir.parent], progress=False, traces=False
    )  # only a tune: still a report
    assert alone["runs"] == [] and len(alone["tunes"]) == 1
    index = write_report(alone, tmp_path / "report", progress=False).index_html.read_text()
    section = index[index.index('<section id="tuning">') :]
    for text in ("DDP tuning", "bucket-1", "--comm-hook powersgd", "(flagged)", "make profile-ddp"):
        assert text in section
    assert 'id="figure-tune-0"' in section


@pytest.mark.integration
def test_a_failing_trial_is_recorded_and_the_tune_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("DPSCOPE_FAIL_RANK", "1")  # every trial's rank 1 fails at step 0
    monkeypatch.setenv("DPSCOPE_FAIL_STEP", "0")
    proc = run_tune(
        ["--trials", "1", "--candidates", "static-graph", "--runs-dir", str(tmp_path), "--tune-id", "t"]
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr  # no baseline trial succeeded
    rec = json.loads((tmp_path / "t" / "tune.json").read_text())
    for arm in (rec["baseline"], rec["candidates"][0]):
        assert arm["status"] == "failed" and len(arm["trials"]) == 1
        assert "injected failure on rank 1" in arm["trials"][0]["error"]
    assert "failed" in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.integration
def test_budget_stops_early_and_reports_what_finished(tmp_path):
    proc = run_tune(
        ["--trials", "1", "--candidates", "bucket-1,bucket-5", "--budget-s", "1",
         "--runs-dir", str(tmp_path), "--tune-id", "t"]
    )  # fmt: skip
    rec = json.loads((tmp_path / "t" / "tune.json").read_text())
    arms = [rec["baseline"], *rec["candidates"]]
    assert sum(len(a["trials"]) for a in arms) == 1  # the first trial always runs
    assert rec["stopped_early"] and "TUNE_BUDGET_S=1" in rec["stop_reason"]
    assert sorted(a["status"] for a in arms) == ["not_run", "not_run", "ok"]
    assert "stopped early" in proc.stdout


@pytest.mark.integration
def test_hostile_and_damaged_tune_json_cost_one_line_not_the_report(tune_dir, tmp_path):
    rec = json.loads((tune_dir / "tune.json").read_text())
    rec["candidates"][0]["reason"] = "<script>alert(1)</script>"
    rec["candidates"][1]["speedup_vs_baseline"] = "fast"  # wrong type: shown as missing
    rec["command"] = "make profile-ddp ARGS='<b>x</b>'"
    (tmp_path / "runs" / "tune-evil").mkdir(parents=True)
    (tmp_path / "runs" / "tune-evil" / "tune.json").write_text(json.dumps(rec))
    (tmp_path / "runs" / "tune-broken").mkdir()
    (tmp_path / "runs" / "tune-broken" / "tune.json").write_text("{not json")
    data = compare_runs([tmp_path / "runs"], progress=False, traces=False)
    assert [t["tune_id"] for t in data["tunes"]] == ["tune-t"]  # the copy keeps its tune_id
    assert data["tunes"][0]["candidates"][1]["speedup_vs_baseline"] is None
    [bad] = data["skipped"]
    assert bad["path"].endswith("tune.json") and "not JSON" in bad["reason"]
    html = write_report(data, tmp_path / "report", progress=False).index_html.read_text()
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
