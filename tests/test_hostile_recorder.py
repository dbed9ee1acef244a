"""Hostile input v4 (issue 36), the RunRecorder class: its contract, each breach one clear error
instead of a segfault, a silent truncation or a record its own reader refuses. In-process, with a
real model, optimizer and torch.profiler session (the atexit close runs in a process of its own:
tests/test_hostile_processes.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from torch import nn

from profiler import RunRecorder
from profiler.recorder import RecorderError
from profiler.session import ProfileConfig, ProfilerSession
from tests.conftest import read_run

PROFILE = ProfileConfig(wait=0, warmup=0, active=1)


def _train(rec: RunRecorder, model: nn.Module, steps: int, samples=None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        with rec.step(samples=samples):
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
            opt.zero_grad()


@pytest.mark.parametrize(
    ("samples", "words"),
    [
        (-1, "samples must be a positive integer (>= 1); got -1"),
        (0, "got 0"),
        (7.9, "got 7.9 (float)"),
        (True, "got True (bool)"),
        ("8", "got '8' (str)"),
    ],
)
def test_samples_must_be_a_positive_integer(samples, words, tmp_path):
    """`samples=-1` was written and then refused by dpscope's own reader; 7.9 was stored as 7."""
    model = nn.Linear(3, 2)
    with RunRecorder(runs_dir=tmp_path, run_id="s", model=model, warmup_steps=0) as rec:
        _train(rec, model, 2)
        with pytest.raises(ValueError) as err:
            _train(rec, model, 1, samples=samples)
        assert words in str(err.value)
        assert not rec.in_step  # the refused step never opened
    assert read_run(tmp_path / "s")["status"] == "ok"  # the reader accepts what was written
    rows = (tmp_path / "s" / "steps.csv").read_text().splitlines()
    assert len(rows) == 1 + 2


def test_numpy_and_tensor_integers_are_samples(tmp_path):
    import numpy as np

    model = nn.Linear(3, 2)
    with RunRecorder(runs_dir=tmp_path, run_id="n", model=model, warmup_steps=0) as rec:
        _train(rec, model, 1, samples=np.int64(4))
        _train(rec, model, 1, samples=torch.tensor(4))
    with (tmp_path / "n" / "steps.csv").open(newline="") as f:
        samples = [row["samples"] for row in csv.DictReader(f)]
    assert samples == [
        "4",
        "4",
    ]


def test_a_step_after_close_and_a_nested_step_are_errors(tmp_path):
    model = nn.Linear(3, 2)
    rec = RunRecorder(runs_dir=tmp_path, run_id="c", model=model, warmup_steps=0)
    with pytest.raises(
        RecorderError, match=r"rec.step\(\) inside rec.step\(\) \(step 0 is still open\)"
    ):
        with rec.step():
            with rec.step():
                pass
    rec.close()
    with pytest.raises(RecorderError, match=r"a step after close\(\) of the recorder"):
        _train(rec, model, 1)


def test_two_recorders_at_once_are_refused_not_a_segfault(tmp_path):
    """Two RunRecorders at once crashed the process in Kineto ("disableProfiler called but no
    active profiling session")."""
    model = nn.Linear(3, 2)
    with RunRecorder(runs_dir=tmp_path, run_id="one", model=model, profile=PROFILE) as first:
        _train(first, model, 2)
        with pytest.raises(RecorderError, match="is still open in this process; close it first"):
            RunRecorder(runs_dir=tmp_path, run_id="two", model=model, profile=PROFILE)
        _train(first, model, 1)
    assert not (tmp_path / "two").exists()
    with RunRecorder(runs_dir=tmp_path, run_id="two", model=model, profile=PROFILE) as second:
        _train(second, model, 2)  # once the first is closed, another may record
    assert read_run(tmp_path / "one")["status"] == read_run(tmp_path / "two")["status"] == "ok"


def test_a_recorder_inside_a_running_dpscope_profiler_is_refused(tmp_path):
    session = ProfilerSession(
        PROFILE, trace_dir=tmp_path / "t", worker_name="rank0", use_cuda=False
    )
    session.start()
    try:
        with pytest.raises(RecorderError, match="cannot record inside dpscope's training loop"):
            RunRecorder(runs_dir=tmp_path, run_id="inner")
        other = ProfilerSession(
            PROFILE, trace_dir=tmp_path / "u", worker_name="rank0", use_cuda=False
        )
        with pytest.raises(RuntimeError, match="already running in this process"):
            other.start()
    finally:
        session.stop()
    assert not (tmp_path / "inner").exists()


def test_a_taken_run_id_is_refused_and_default_ids_are_unique(tmp_path):
    """A second RunRecorder(run_id=X) replaced the first's run; two default ids in one second
    (`recorder-<second>`) collided."""
    model = nn.Linear(3, 2)
    with RunRecorder(runs_dir=tmp_path, run_id="x", model=model, warmup_steps=0) as rec:
        _train(rec, model, 1)
    before = (tmp_path / "x" / "run.json").read_bytes()
    with pytest.raises(ValueError, match=r"already holds a run; pick another RunRecorder\(run_id"):
        RunRecorder(runs_dir=tmp_path, run_id="x")
    assert (tmp_path / "x" / "run.json").read_bytes() == before
    made = []
    for _ in range(3):
        with RunRecorder(runs_dir=tmp_path, model=model, warmup_steps=0) as rec:
            _train(rec, model, 1)
            made.append(Path(rec.run_dir).name)
    assert len(set(made)) == 3 and all(m.startswith("recorder-") for m in made)
