"""Issue 33: interleaved rounds until the speedup is known. The seeded bootstrap on hand-built
values with exact expectations, the stop rule of `--repeat N|auto`, the launcher's round loop on
real run folders (written by the contract's writers, read back through its readers), and the
runs JSON and report showing the median with its 95% CI over the rounds."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from analysis.report.build import write_report
from analysis.report.verdict import verdict
from analysis.runs.compare import compare_runs
from profiler.runfolder.layout import write_run_json, write_steps_csv
from profiler.runfolder.rounds import (
    AUTO_MAX_ROUNDS,
    BOOTSTRAP_RESAMPLES,
    bootstrap_ci,
    ci_within,
    repeat_done,
)
from workloads.launch.rounds import ModeResult, check_repeat, repeat_count, run_rounds

# --- the bootstrap: exact expectations --------------------------------------------------------


def test_bootstrap_of_one_or_equal_values_is_that_value():
    assert bootstrap_ci([]) is None and bootstrap_ci([math.nan, None]) is None
    assert bootstrap_ci([3.0]) == (3.0, 3.0, 3.0)
    assert bootstrap_ci([2.0, 2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)


def test_bootstrap_of_two_and_three_values_spans_them():
    # Two values a < b: a resample's median is a, (a+b)/2 or b with chances 1/4, 1/2, 1/4, so
    # the 2.5% and 97.5% points are a and b; three: the median is the smallest with chance 7/27.
    assert bootstrap_ci([1.0, 2.0]) == (1.5, 1.0, 2.0)
    assert bootstrap_ci([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)


def _exact_median_cdf(n: int, j: int) -> float:
    """P(median of n draws from n distinct values ≤ the j-th smallest), n odd (exact)."""
    need, p = (n + 1) // 2, j / n
    return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(need, n + 1))


def test_bootstrap_of_seven_values_cuts_the_order_statistics_the_exact_law_says():
    # The exact bootstrap law of the median of 1..7: P(≤ 1) = 0.010 and P(≤ 2) = 0.108, so the
    # 2.5% point is 2 (and by symmetry the 97.5% point 6), with margins far beyond the
    # Monte-Carlo error of 2,000 resamples (±0.0022 at 0.01).
    assert _exact_median_cdf(7, 1) < 0.015 and _exact_median_cdf(7, 2) > 0.1
    assert BOOTSTRAP_RESAMPLES == 2000
    assert bootstrap_ci([5.0, 1.0, 7.0, 3.0, 2.0, 6.0, 4.0]) == (4.0, 2.0, 6.0)


def test_bootstrap_is_seeded():
    values = [1.0 + 0.1 * math.sin(i) + 0.01 * i for i in range(20)]
    assert bootstrap_ci(values) == bootstrap_ci(list(values))
    assert bootstrap_ci(values, seed=1) != bootstrap_ci(values)  # the seed is what repeats it


def test_ci_within_five_percent_of_the_median():
    assert ci_within((2.0, 1.9, 2.1))  # ±5.0%
    assert not ci_within((2.0, 1.9, 2.11))
    assert not ci_within(None) and not ci_within((0.0, 0.0, 0.0))


# --- the stop rule ----------------------------------------------------------------------------


def _done(speedups: dict, rounds: int, repeat: int | None = None, elapsed=1.0, budget=None):
    return repeat_done(speedups, rounds=rounds, repeat=repeat, elapsed_s=elapsed, budget_s=budget)


def test_auto_stops_on_a_narrow_ci_from_three_rounds_on():
    tight = {"ddp-gloo": [2.0, 2.02, 1.98]}
    assert _done({"ddp-gloo": [2.0, 2.02]}, 2) is None  # two values: too few to stop on
    reason = _done(tight, 3)
    assert reason and "within ±5%" in reason and "ddp-gloo 1.0%" in reason
    # every parallel mode must be known
    assert _done({**tight, "ddp-nccl": [1.0, 2.0, 1.5]}, 3) is None


def test_auto_stops_at_the_round_bound_or_the_budget():
    wide = {"ddp-gloo": [1.5, 2.5, 1.5, 2.5, 1.5]}
    assert _done({"ddp-gloo": wide["ddp-gloo"][:4]}, 4) is None
    assert "bound of 5 rounds" in _done(wide, AUTO_MAX_ROUNDS)
    # a budget replaces the bound: another round starts while it fits (elapsed + the mean round)
    assert _done(wide, 5, elapsed=50.0, budget=100.0) is None
    assert "budget of 100 s" in _done(wide, 5, elapsed=90.0, budget=100.0)


def test_a_fixed_count_runs_that_many_rounds():
    wide = {"ddp-gloo": [1.0, 3.0]}
    assert _done(wide, 1, repeat=2) is None
    assert _done(wide, 2, repeat=2) == "2 of 2 rounds"
    assert "budget" in _done(wide, 1, repeat=9, elapsed=10.0, budget=15.0)


def _args(**kw) -> argparse.Namespace:
    base = {"repeat": "1", "repeat_budget_s": None, "mode": "all", "run_id": "", "nnodes": 1}
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"repeat": "0"}, "--repeat must be `auto` or a whole number >= 1; got '0'"),
        ({"repeat": "often"}, "--repeat must be `auto` or a whole number >= 1"),
        ({"repeat": "auto", "mode": "ddp"}, "needs --mode all"),
        ({"repeat": "3", "run_id": "x"}, "--run-id names one run"),
        ({"repeat": "2", "repeat_budget_s": -1.0}, "--repeat-budget-s must be > 0 s"),
        ({"repeat": "auto", "nnodes": 2}, "--repeat runs on one node"),
    ],
)
def test_bad_repeat_options_are_one_line(kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        check_repeat(_args(**kw))


def test_good_repeat_options():
    assert repeat_count("auto") is None and repeat_count("4") == 4
    check_repeat(_args(repeat="auto"))
    check_repeat(_args(repeat="2", mode="ddp"))  # N rounds of one mode are allowed


# --- the launcher's rounds on real run folders ------------------------------------------------


def write_run(run_dir: Path, *, mode: str, step_s: float, rnd: int, steps: int = 12) -> Path:
    """An `ok` run folder (global batch 64, every step quiet) whose throughput is 64 / step_s."""
    world = 2 if mode == "ddp" else 1
    rows = [
        {"rank": r, "epoch": 0, "step": s, "warmup": int(s < 2), "profiled": 0,
         "step_time_s": step_s, "data_s": 0.0, "forward_s": step_s / 2, "backward_s": step_s / 2,
         "optimizer_s": 0.0, "samples": 64 // world, "loss": 1.0,
         "other_cpu_cores": 0.0 if r == 0 else None}
        for s in range(steps) for r in range(world)
    ]  # fmt: skip
    write_steps_csv(run_dir, rows)
    record = {
        "schema_version": 2, "run_id": run_dir.name, "status": "ok",
        "config": {"mode": mode, "backend": "gloo" if world > 1 else "none", "world_size": world,
                   "nproc_per_node": world, "model": "mlp", "dataset": "synthetic",
                   "scaling": "strong", "global_batch": 64, "per_device_batch": 64 // world,
                   "seed": 0, "amp": "none", "devices": ["cpu"] * world,
                   "repeat_id": "repeat-test", "repeat_round": rnd},
        "env": {"os": "Linux", "cpu_cores": 2, "threads_per_rank": 2 // world},
        "metrics": {"samples_per_s": 64 / step_s},
    }  # fmt: skip
    write_run_json(run_dir, record)
    return run_dir


def rounds_of(tmp_path: Path, speedups: list[float], fail_at: int | None = None):
    """A `one_round` that writes round k's single run (0.1 s/step) and a DDP run at speedup k."""

    def one_round(k: int) -> list[ModeResult]:
        single = write_run(tmp_path / f"single-r{k}", mode="single", step_s=0.1, rnd=k)
        ddp = write_run(tmp_path / f"ddp-r{k}", mode="ddp", step_s=0.1 / speedups[k], rnd=k)
        status = "failed" if k == fail_at else "ok"
        return [ModeResult("single", "ok", single), ModeResult("dp", "skipped", None),
                ModeResult("ddp-gloo", status, ddp)]  # fmt: skip

    return one_round


def test_auto_rounds_stop_on_the_ci_and_the_report_shows_median_and_ci(tmp_path, capsys):
    runs = tmp_path / "runs"
    statuses = run_rounds(_args(repeat="auto"), rounds_of(runs, [1.9, 1.92, 1.88, 3.0, 3.0]))
    out = capsys.readouterr().out
    assert statuses == ["ok", "skipped", "ok"] * 3  # the CI was within ±5% after round 3
    assert "round 3: speedup ddp-gloo 1.90× (95% CI 1.88–1.92, 3 rounds)" in out
    assert "stopped after 3 round(s): the speedup's 95% CI is within ±5%" in out
    data = compare_runs([runs], progress=False, traces=False)
    ddp = {r["run_id"]: r for r in data["runs"] if r["mode"] == "ddp"}
    # each round's DDP run against its own round's single run
    assert {k: r["baseline_run_id"] for k, r in ddp.items()} == {
        f"ddp-r{k}": f"single-r{k}" for k in range(3)
    }
    assert [ddp[f"ddp-r{k}"]["speedup"] for k in range(3)] == pytest.approx([1.9, 1.92, 1.88])
    (g,) = [g for g in data["groups"] if g["mode"] == "ddp"]
    assert g["n_rounds"] == 3 and g["throughput_basis"] == "quiet"
    assert (g["speedup_median"], g["speedup_ci95_low"], g["speedup_ci95_high"]) == pytest.approx(
        (1.9, 1.88, 1.92)
    )
    assert g["scaling_efficiency_median"] == pytest.approx(0.95)
    text = "".join(s["text"] for s in verdict(data)[0]["segments"])
    assert (
        "1.90× over single device (95% CI 1.88–1.92× over 3 rounds; 95% efficiency, 94–96%)" in text
    )
    html = write_report(data, tmp_path / "report", progress=False).index_html.read_text()
    assert "Speedup (×, median [95% CI])" in html and "1.90 [1.88–1.92]" in html


def test_auto_rounds_stop_at_the_bound_and_a_failure_ends_them(tmp_path, capsys):
    wide = [1.5, 2.5, 1.5, 2.5, 1.5, 2.5]
    statuses = run_rounds(_args(repeat="auto"), rounds_of(tmp_path / "a", wide))
    assert len(statuses) == 3 * AUTO_MAX_ROUNDS
    assert "stopped after 5 round(s): the bound of 5 rounds" in capsys.readouterr().out
    statuses = run_rounds(_args(repeat="auto"), rounds_of(tmp_path / "b", wide, fail_at=1))
    assert statuses[-1] == "failed" and len(statuses) == 6
    assert "stopped after round 2: a run did not finish ok" in capsys.readouterr().out


def test_one_round_without_repeat_prints_nothing_of_rounds(tmp_path, capsys):
    assert run_rounds(_args(), rounds_of(tmp_path, [2.0])) == ["ok", "skipped", "ok"]
    assert "round" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mode", "all", "--repeat", "twice"], "--repeat must be `auto` or a whole number"),
        (["--mode", "single", "--repeat", "auto"], "--repeat auto measures the speedup"),
        (["--mode", "all", "--repeat", "2", "--repeat-budget-s", "0"], "--repeat-budget-s must"),
    ],
)
def test_the_launcher_refuses_bad_repeat_options_in_one_line(tmp_path, capsys, argv, message):
    from workloads.launch import launcher

    code = launcher.main([*argv, "--runs-dir", str(tmp_path / "runs")], prog="dpscope profile")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("dpscope profile: error: ")
    assert message in err[0] and not (tmp_path / "runs").exists()
