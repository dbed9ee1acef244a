"""Clock offsets on real dpscope traces (analysis/trace/clocks.py): a one-host run is unchanged,
and real 2- and 4-rank torchrun jobs whose ranks 1-3 had their clocks shifted by up to ±5 ms
(the DPSCOPE_CLOCK_SHIFT hook, each a host of its own) are put back on one clock.

The truth is known: the same traces with the shift undone are one host's, on one clock. With
the clock probe the traces carry, the uncertainty is at most 50 µs. Without it (the probe
stripped, as in traces of other tools or older dpscope versions) only the collectives bound the
offset; on a 2-core machine gloo's collectives take milliseconds on 4 starved ranks, so the
uncertainty is that large there. Either way the truth must be inside it, and every cross-rank
figure may move only by the estimate's own error."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.cli.main import main as analysis_main
from analysis.cli.report import main as report_main
from analysis.trace.folder import analyze_trace_dir, find_trace_files, reduce_files
from profiler.clockshift import apply_clock_shift
from profiler.runfolder.clockprobe import CLOCK_PROBE_KEY
from tests.conftest import TINY, launch

# serial: its clock-offset uncertainty bounds assume an unloaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.serial]

SHIFT_US = {1: -5000.0, 2: 2500.0, 3: 5000.0}
_CLOCK_KEYS = ("clock_offset_us", "clock_offset_uncertainty_us", "clock_aligned")


def _without_clock(result: dict) -> str:
    out = {k: v for k, v in result.items() if k != "clock_align"}
    out["ranks"] = [{k: v for k, v in r.items() if k not in _CLOCK_KEYS} for r in out["ranks"]]
    out["stragglers"] = [
        {k: v for k, v in r.items() if k not in _CLOCK_KEYS} for r in out["stragglers"]
    ]
    return json.dumps(out, sort_keys=True)


def test_one_host_traces_json_is_unchanged_in_auto_mode(ddp_mlp_run):
    traces = ddp_mlp_run / "traces"
    auto = analyze_trace_dir(traces, progress=False)
    off = analyze_trace_dir(traces, progress=False, clock_align="off")
    assert [r["host"] for r in auto["ranks"]] == [auto["ranks"][0]["host"]] * 2
    assert [(r["clock_offset_us"], r["clock_offset_uncertainty_us"]) for r in auto["ranks"]] == [
        (0.0, 0.0)
    ] * 2
    assert not any(r["clock_aligned"] for r in auto["ranks"])
    # Byte for byte, but for the clock fields themselves (null when off).
    assert _without_clock(auto) == _without_clock(off)
    assert {r["clock_offset_us"] for r in off["ranks"]} == {None}


def _host(path: Path) -> str:
    return json.loads(gzip.decompress(path.read_bytes()))["host_name"]


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def shifted_job(request, runs_dir: Path, tmp_path_factory) -> tuple[int, Path, Path]:
    """(world size, a real DDP job's traces with ranks 1.. shifted by SHIFT_US, the same traces
    with the shifts undone: one host, one clock)."""
    world = request.param
    run_id = f"clock-shift-{world}"
    tiny = list(TINY)
    tiny[tiny.index("--max-steps") + 1] = "16"
    shifts = {r: s for r, s in SHIFT_US.items() if r < world}
    launch(
        [
            "--mode",
            "ddp",
            "--nproc",
            str(world),
            "--backend",
            "gloo",
            "--run-id",
            run_id,
            "--runs-dir",
            str(runs_dir),
            *tiny,
            "--model-args",
            "hidden=8",
            "--profile-active",
            "12",
        ],
        env={"DPSCOPE_CLOCK_SHIFT": ",".join(f"{r}:{s}" for r, s in shifts.items())},
    )
    traces = runs_dir / run_id / "traces"
    truth = tmp_path_factory.mktemp("unshifted")
    host0 = _host(next(traces.glob("rank0.*")))
    for path in sorted(traces.glob("rank*")):
        rank = int(path.name[4 : path.name.index(".")])
        copy = truth / path.name
        shutil.copy(path, copy)
        if rank in shifts:
            assert _host(path) == f"{host0}-shift{rank}"
            apply_clock_shift(copy, -shifts[rank], rank)
            body = json.loads(gzip.decompress(copy.read_bytes()))
            body["host_name"] = host0
            copy.write_bytes(gzip.compress(json.dumps(body).encode()))
    return world, traces, truth


def _close_arrivals(one_clock: Path, gap_us: float) -> float:
    """Share of matched calls whose last two arrivals (one clock) were under `gap_us` apart."""
    good, _ = reduce_files(find_trace_files(one_clock), workers=1, progress=False)
    origin = min(s.origin_ns for s in good)
    close = total = 0
    for name in good[0].instances:
        starts = [s.instances[name]["start_us"] + (s.origin_ns - origin) / 1000 for s in good]
        m = min(x.size for x in starts)
        top = np.sort(np.vstack([x[:m] for x in starts]), axis=0)[-2:]
        close += int(((top[1] - top[0]) < gap_us).sum())
        total += m
    return close / total


def _without_probes(traces: Path, out: Path, *, required: bool = True) -> Path:
    """A copy of `traces` without their clock probes (`required`: every rank had one)."""
    out.mkdir()
    for path in traces.glob("rank*"):
        body = json.loads(gzip.decompress(path.read_bytes()))
        assert CLOCK_PROBE_KEY in body or not required  # every rank of a dpscope job has one
        body.pop(CLOCK_PROBE_KEY, None)
        (out / path.name).write_bytes(gzip.compress(json.dumps(body).encode()))
    return out


@pytest.mark.parametrize("probe", ["probe", "collectives only"])
def test_shifted_clocks_are_recovered_and_the_straggler_figures_put_back(
    shifted_job, probe, tmp_path
):
    world, traces, truth = shifted_job
    if probe != "probe":
        traces = _without_probes(traces, tmp_path / "traces")
    # force: every estimated offset is removed, however uncertain (auto's rule: below).
    shifted = analyze_trace_dir(traces, progress=False, clock_align="force")
    auto = analyze_trace_dir(traces, progress=False)
    one_clock = analyze_trace_dir(truth, progress=False)
    raw = analyze_trace_dir(traces, progress=False, clock_align="off")
    print(
        f"\n{world} ranks:",
        [(r["clock_offset_us"], r["clock_offset_uncertainty_us"]) for r in shifted["ranks"]],
    )
    errors = {0: 0.0}
    for row in shifted["ranks"][1:]:
        r = row["rank"]
        errors[r] = row["clock_offset_us"] - SHIFT_US[r]
        assert abs(errors[r]) <= row["clock_offset_uncertainty_us"], row
        if probe == "probe":
            assert row["clock_offset_uncertainty_us"] <= 50.0, row
        assert row["clock_aligned"] and row["host"].endswith(f"-shift{r}")
        off = auto["ranks"][r]
        assert off["clock_aligned"] == (
            abs(off["clock_offset_us"]) > off["clock_offset_uncertainty_us"]
        )
    worst = max(abs(e) for e in errors.values())
    # The unshifted run's skew within 5% or 20 µs, give or take what the estimate itself got
    # wrong: each start moved by its rank's error, so the skew by at most two of them (with the
    # probe under 1 µs here, so the 5% or 20 µs itself; without it, milliseconds).
    for got, want in zip(shifted["stragglers"], one_clock["stragglers"], strict=True):
        bound = max(0.05 * want["start_skew_us_mean"], 20.0) + abs(errors[got["rank"]]) + worst
        assert abs(got["start_skew_us_mean"] - want["start_skew_us_mean"]) <= bound, (got, want)
        assert got["matched_calls"] == want["matched_calls"]
    # An arrival order can flip only where the last two arrivals were closer than the error:
    # the score moves by at most the share of such near ties (none with the probe's error here).
    close = _close_arrivals(truth, 2 * worst)
    for got, want in zip(shifted["stragglers"], one_clock["stragglers"], strict=True):
        assert abs(got["straggler_score"] - want["straggler_score"]) <= close + 1e-9, (got, want)
    # Per-rank figures are durations on each rank's own clock (the wait for the slowest rank
    # among them): removing the offsets moves none of them.
    assert json.loads(_without_clock(shifted))["ranks"] == json.loads(_without_clock(raw))["ranks"]
    # Unaligned, the shifts alone move the skews by milliseconds.
    moved = max(
        abs(o["start_skew_us_mean"] - w["start_skew_us_mean"])
        for o, w in zip(raw["stragglers"], one_clock["stragglers"], strict=True)
    )
    assert moved > 1000.0
    # The one-clock traces are one host: nothing is estimated or removed.
    assert {r["clock_offset_us"] for r in one_clock["ranks"]} == {0.0}


def test_a_real_pair_sharing_too_few_collectives_is_left_unaligned(ddp_mlp_run, tmp_path):
    """The session's 2-rank run traces 2 steps (one gradient all_reduce each); rank 1 on a host
    of its own and without a clock probe (another tool's trace, or an older dpscope's): too few
    shared calls to estimate its clock, one warning, nothing removed."""
    folder = _without_probes(ddp_mlp_run / "traces", tmp_path / "traces", required=False)
    rank1 = next(folder.glob("rank1.*"))
    apply_clock_shift(rank1, 3000.0, 1)
    result = analyze_trace_dir(folder, progress=False)
    row = result["ranks"][1]
    assert (row["clock_offset_us"], row["clock_aligned"]) == (None, False)
    [warning] = [w for w in result["warnings"] if "clock" in w]
    assert warning.startswith(f"rank 1 (host {row['host']}): clock left unaligned — ")
    assert "collective call(s) shared with the reference rank, fewer than 3" in warning


def test_the_report_and_the_cli_show_each_ranks_clock_offset(shifted_job, tmp_path, capsys):
    """`dpscope report --clock-align force` and `dpscope traces`: the stragglers table (its CSV,
    the page and the terminal's) carries each rank's estimated offset and its uncertainty."""
    world, traces, _ = shifted_job
    run, out = traces.parent, tmp_path / "report"
    want = analyze_trace_dir(traces, progress=False, clock_align="force")["ranks"]
    argv = [str(run), "--out", str(out), "--clock-align", "force", "--no-progress"]
    assert report_main(argv, prog="dpscope report") == 0
    table = pd.read_csv(out / "stragglers.csv")
    got, spread = table["clock_offset_us"].tolist(), table["clock_offset_uncertainty_us"].tolist()
    assert got == pytest.approx([r["clock_offset_us"] for r in want], abs=0.05)
    assert spread == pytest.approx([r["clock_offset_uncertainty_us"] for r in want], abs=0.05)
    assert abs(got[1] - SHIFT_US[1]) <= spread[1] and len(got) == world
    page = (out / "index.html").read_text()
    assert "Clock offset vs rank 0" in page and f"{got[1]:,.1f}" in page
    capsys.readouterr()
    argv = ["traces", str(traces), "--clock-align", "force", "--no-progress"]
    assert analysis_main(argv, prog="dpscope") == 0
    printed = capsys.readouterr().out
    assert "Clock offset vs rank 0" in printed and f"{got[1]:,.1f}" in printed
