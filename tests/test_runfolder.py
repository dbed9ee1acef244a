"""The run-folder contract (profiler/runfolder/layout.py): its writers against the typed reader
(profiler/runfolder/records.py), the steps.csv columns against StepRow, and the one "measured unprofiled
steps" rule with its one fallback and warning, as the trainer, the run entry and the projection
apply it. Real run folders are checked too: tests.conftest.read_run decodes every run.json a test
reads (training, skipped, failed, restarted and comm runs) with the typed reader."""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pytest

from analysis.project.inputs import measured_steps
from analysis.runs.quiet import phases_summary
from profiler.environment import collect_env
from profiler.runfolder.layout import (
    NO_UNPROFILED_STEP_WARNING,
    STEPS_COLUMNS,
    throughput_steps,
    write_run_json,
    write_steps_csv,
)
from profiler.runfolder.records import InvalidRecord, read_comm_record, read_record
from profiler.runfolder.schema import REQUIRED_STEP_COLUMNS, Config, ErrorInfo, StepRow
from profiler.runfolder.stepmetrics import step_metrics, throughput_rows
from profiler.runfolder.steps import read_steps
from profiler.runfolder.versions import RUN_JSON_SCHEMA_VERSION
from tests.conftest import REPO
from tests.source_trees import parse_file
from workloads.config import TrainConfig
from workloads.plan import Environment, plan
from workloads.runrecord import run_record

CPU = Environment(system="Linux", cuda=False, gpus=0, nccl=False, cpu_cores=4, torch_threads=4)


# --- the rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("warmup", "profiled", "rows", "warning"),
    [
        # normal: warm-up 0-1, profiler on 2-3, measured unprofiled 4-5
        ([1, 1, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0], [4, 5], None),
        # fallback: every measured step was profiled -> every measured step, with the warning
        ([1, 1, 0, 0], [0, 1, 1, 1], [2, 3], NO_UNPROFILED_STEP_WARNING),
        # no measured step at all: nothing, and no fallback to warm-up steps
        ([1, 1], [0, 0], [], None),
        # schema 1 (no `profiled` column): every measured step counts as unprofiled
        ([1, 0, 0], None, [1, 2], None),
        # an empty cell (None / NaN) reads as unprofiled
        ([0, 0, 0], [None, float("nan"), 1], [0, 1], None),
    ],
)
def test_throughput_steps_rule(warmup, profiled, rows, warning):
    mask, got = throughput_steps(warmup, profiled)
    assert list(np.flatnonzero(mask)) == rows
    assert got == warning


def step_rows(rows: list[dict]) -> list[StepRow]:
    """StepRows of hand-written rows: the columns not given are 0 (times, step) or empty."""
    base = dict.fromkeys(REQUIRED_STEP_COLUMNS, 0)
    return [StepRow(**(base | r)) for r in rows]


def _steps_frame(profiled: list[int]) -> pd.DataFrame:
    """Two ranks, six steps (two warm-up), step s taking s+1 seconds split over the phases."""
    rows = []
    for rank in (0, 1):
        for step, prof in enumerate(profiled):
            t = float(step + 1)
            rows.append(
                dict(
                    rank=rank, epoch=0, step=step, warmup=int(step < 2), profiled=prof,
                    step_time_s=t, data_s=0.1 * t, forward_s=0.3 * t, backward_s=0.5 * t,
                    optimizer_s=0.1 * t, profiler_s=0.0, samples=10, loss=1.0, rss_bytes=1,
                    cuda_allocated_bytes=0, other_cpu_cores=0.25 * rank,
                )
            )  # fmt: skip
    return pd.DataFrame(rows, columns=STEPS_COLUMNS)


@pytest.mark.parametrize(
    ("profiled", "steps", "warned"),
    [([0, 1, 1, 1, 0, 0], [4, 5], False), ([0, 1, 1, 1, 1, 1], [2, 3, 4, 5], True)],
)
def test_trainer_run_entry_and_projection_measure_the_same_steps(profiled, steps, warned):
    """The three users of the rule pick the same rows and give the same one warning."""
    frame = _steps_frame(profiled)
    rows = step_rows(frame.to_dict("records"))
    picked, w_summary = throughput_rows(rows)
    assert sorted({r.step for r in picked}) == steps
    metrics, warnings = step_metrics(rows)
    expected_mean = frame[frame["step"].isin(steps)]["step_time_s"].mean()
    assert metrics.step_time_s.mean == pytest.approx(expected_mean)
    overall, per_rank, w_entry = phases_summary(frame)
    assert overall["forward"] == pytest.approx(0.3 * expected_mean)
    assert [r["step_time"] for r in per_rank] == pytest.approx([expected_mean] * 2)
    body, w_project = measured_steps(frame, Config(mode="single", world_size=1))
    assert sorted(set(body["step"])) == steps
    expected = NO_UNPROFILED_STEP_WARNING if warned else None
    assert w_summary == w_entry == w_project == expected
    assert warnings == ([expected] if warned else [])


# --- steps.csv: writer columns = reader fields ------------------------------------------------


def test_steps_columns_are_the_readers_fields(tmp_path: Path):
    assert set(STEPS_COLUMNS) == set(StepRow.__struct_fields__)
    assert set(REQUIRED_STEP_COLUMNS) <= set(STEPS_COLUMNS)
    frame = _steps_frame([0, 1, 1, 1, 0, 0])
    write_steps_csv(tmp_path, step_rows(frame.to_dict("records")))
    rows = read_steps(tmp_path / "steps.csv")
    assert len(rows) == len(frame)
    for row, want in zip(rows, frame.to_dict("records"), strict=True):
        assert {c: getattr(row, c) for c in STEPS_COLUMNS} == pytest.approx(want)
    with pytest.raises(TypeError):  # a StepRow has exactly the columns
        step_rows([{**frame.iloc[0].to_dict(), "extra_s": 1.0}])


# --- run.json: every writer's record is accepted by the typed reader ---------------------------


@pytest.mark.parametrize("mode", ["single", "ddp", "dp"])
@pytest.mark.integration
def test_launcher_records_pass_the_typed_reader(tmp_path: Path, mode: str):
    """The launcher's `running` record and a `skipped` one (DP without GPUs has no layout)."""
    cfg = TrainConfig(mode=mode, model="mlp", device="cpu", run_id=f"r-{mode}")
    laid_out = plan(cfg, CPU, nproc=2)
    status = "skipped" if laid_out.reason else "running"
    error = ErrorInfo.written(message=laid_out.reason, rank=None, exit_code=None, log_tail=[])
    record = run_record(
        cfg,
        laid_out,
        status=status,
        env=collect_env(threads_per_rank=laid_out.threads_per_rank),
        error=error if laid_out.reason else None,
    )
    path = write_run_json(tmp_path / cfg.run_id, record)
    rec, raw = read_record(path)
    assert raw == msgspec.to_builtins(record)
    assert rec.status == status == ("skipped" if mode == "dp" else "running")
    assert rec.schema_version == RUN_JSON_SCHEMA_VERSION and rec.created_at == record.created_at


@pytest.mark.integration
def test_a_record_breaking_the_contract_is_one_line(tmp_path: Path):
    cfg = TrainConfig(mode="single", model="mlp", device="cpu", run_id="bad")
    record = run_record(cfg, plan(cfg, CPU), status="running", env=collect_env(threads_per_rank=1))
    bad = msgspec.structs.replace(record, schema_version=RUN_JSON_SCHEMA_VERSION + 1)
    path = write_run_json(tmp_path, bad)
    with pytest.raises(InvalidRecord, match="schema_version"):
        read_record(path)


def test_real_comm_and_training_records_pass_their_readers(single_mlp_run: Path):
    rec, _ = read_record(single_mlp_run / "run.json")
    assert rec.status == "ok" and rec.schema_version == RUN_JSON_SCHEMA_VERSION
    with pytest.raises(InvalidRecord, match="kind"):  # a training run is not a comm run
        read_comm_record(single_mlp_run / "run.json")


def test_every_run_json_write_goes_through_the_contract():
    """The training half and the projection never name run.json themselves: writes go through
    write_run_json, reads through profiler.runfolder.records (bench/ rewrites copies of real runs on
    purpose; analysis/runs reads through the same records)."""
    offenders = []
    for path in [*REPO.glob("workloads/**/*.py"), *REPO.glob("analysis/project/*.py")]:
        for node in ast.walk(parse_file(path)):
            if isinstance(node, ast.Constant) and node.value == "run.json":
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == [], (
        "use profiler.runfolder.layout.RUN_JSON / write_run_json / profiler.runfolder.records"
    )
