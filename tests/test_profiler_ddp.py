"""What a real 2-rank gloo DDP run (torchrun, shared `ddp_mlp_run` fixture) records.

Traces per rank with the profiler steps, the four phase ranges, the collectives with their
input shapes and `distributedInfo`; steps.csv with every step; run.json memory per rank.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from profiler.runfolder.layout import STEP_PHASES, STEPS_COLUMNS
from profiler.session import ProfileConfig
from tests.conftest import read_run

pytestmark = pytest.mark.integration

STEPS = 8  # conftest.TINY --max-steps


def _load(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


@pytest.fixture(scope="module")
def ddp_traces(ddp_mlp_run: Path) -> dict[int, dict]:
    files = {
        r: sorted((ddp_mlp_run / "traces").glob(f"rank{r}.*.pt.trace.json.gz")) for r in (0, 1)
    }
    # Default schedule (wait 1, warmup 1, active 3, repeat 1) over 8 steps: one file per rank.
    assert [len(f) for f in files.values()] == [1, 1], sorted((ddp_mlp_run / "traces").iterdir())
    return {r: _load(f[0]) for r, f in files.items()}


@pytest.mark.parametrize("rank", [0, 1])
def test_trace_has_steps_phases_collectives_and_distributed_info(ddp_traces, rank):
    trace = ddp_traces[rank]
    info = trace["distributedInfo"]
    assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", rank, 2)

    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    assert len(steps) == ProfileConfig().active
    for step in steps:  # every profiled step holds each phase range
        inside = {
            e["name"]
            for e in events
            if step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"]
        }
        assert set(STEP_PHASES) <= inside, (step["name"], sorted(inside)[:20])

    # Chrome/Perfetto trace-event shape: complete events with numeric times on a pid/tid.
    assert trace["traceEvents"] and all("ph" in e for e in trace["traceEvents"])
    assert all(
        isinstance(e["ts"], int | float)
        and isinstance(e["dur"], int | float)
        and "pid" in e
        and "tid" in e
        for e in events
    )

    reduces = [e for e in events if e["name"] == "gloo:all_reduce"]
    assert reduces, "no gloo:all_reduce in the trace"
    for e in reduces:  # record_shapes: the collective carries the gradient bucket's dims
        dims = e["args"]["Input Dims"]
        assert dims and all(isinstance(d, list) for d in dims), e["args"]


def test_trace_files_are_listed_in_run_json(ddp_mlp_run: Path):
    run = read_run(ddp_mlp_run)
    on_disk = sorted(
        p.relative_to(ddp_mlp_run).as_posix() for p in (ddp_mlp_run / "traces").iterdir()
    )
    assert sorted(run["traces"]) == on_disk
    assert run["config"]["profile"] == ProfileConfig().to_dict()


def test_steps_csv_every_step_with_phases_summing_to_step(ddp_mlp_run: Path):
    df = pd.read_csv(ddp_mlp_run / "steps.csv")
    assert list(df.columns) == STEPS_COLUMNS
    for rank in (0, 1):
        assert sorted(df.loc[df["rank"] == rank, "step"]) == list(range(STEPS))
    phases = df[[f"{p}_s" for p in STEP_PHASES]].sum(axis=1)
    assert (df[[f"{p}_s" for p in STEP_PHASES]] >= 0).all().all()
    assert (df["step_time_s"] > 0).all()
    # Phases are disjoint parts of the step, and so is the profiler's work at its end (its
    # trace export, in `profiler_s`); what is left is loop overhead, which must be small.
    assert (df["profiler_s"] >= 0).all()
    export = df.loc[df.groupby("rank")["profiler_s"].idxmax()]
    assert (export["profiled"] == 1).all()  # the export ends the active window
    assert (phases + df["profiler_s"] <= df["step_time_s"] * (1 + 1e-6)).all()
    ratio = phases / (df["step_time_s"] - df["profiler_s"])
    assert ratio.min() >= 0.5 and ratio.median() >= 0.9, df.assign(ratio=ratio)
    assert (df["rss_bytes"] > 0).all()
    assert df["cuda_allocated_bytes"].isna().all()  # CPU run
    warm = df.sort_values(["rank", "step"]).groupby("rank")["warmup"].apply(list)
    for flags in warm:  # warm-up steps come first
        assert set(flags) <= {0, 1} and flags == sorted(flags, reverse=True)


def test_run_json_memory_per_rank(ddp_mlp_run: Path):
    metrics = read_run(ddp_mlp_run)["metrics"]
    for key in ("memory", "memory_after_first_step"):
        entries = metrics[key]
        assert sorted(e["rank"] for e in entries) == [0, 1], entries
        for e in entries:
            assert set(e) == {
                "rank",
                "device",
                "peak_allocated_bytes",
                "peak_reserved_bytes",
                "nvml_used_bytes",
                "peak_rss_bytes",
            }
            assert e["device"] == "cpu" and e["peak_rss_bytes"] > 0
            assert e["peak_allocated_bytes"] is None and e["nvml_used_bytes"] is None


def test_single_run_trace_is_rank0_without_process_group(single_mlp_run: Path):
    (path,) = (single_mlp_run / "traces").glob("*.pt.trace.json.gz")
    assert path.name.startswith("rank0.")
    trace = _load(path)
    names = {e.get("name") for e in trace["traceEvents"]}
    assert set(STEP_PHASES) <= names
    assert not any(n and n.startswith("gloo:") for n in names)
