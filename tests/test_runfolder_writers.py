"""Unit tests of profiler.environment and profiler.runfolder.layout: atomic writers, the steps.csv columns, the env block."""

from __future__ import annotations

import csv
import json
import os
import re
import stat
from pathlib import Path

import pytest

from profiler import environment
from profiler.runfolder import atomic, layout
from tests.conftest import REPO


def test_steps_columns_match_the_contract():
    doc = (REPO / "docs" / "reference" / "run-folder.md").read_text()
    block = doc.split("Columns (fixed order):", 1)[1].split("\n\n", 1)[0]
    documented = [c.strip() for c in block.replace("`", "").replace("\n", " ").split(",")]
    assert layout.STEPS_COLUMNS == documented


def test_write_json_atomic_replaces_and_leaves_no_temp(tmp_path: Path):
    target = tmp_path / "sub" / "run.json"
    atomic.write_json_atomic(target, {"a": 1})
    atomic.write_json_atomic(target, {"a": 2, "b": [1, None]})
    assert json.loads(target.read_text()) == {"a": 2, "b": [1, None]}
    assert [p.name for p in target.parent.iterdir()] == ["run.json"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_atomic_writes_get_the_umask_file_mode(tmp_path: Path, umask: int):
    """Not mkstemp's private 0600: what open() would give under the process umask, so a run
    folder or a report on a shared filesystem is as readable as the user's other files."""
    old = os.umask(umask)
    try:
        atomic.write_json_atomic(tmp_path / "run.json", {"a": 1})
        atomic.write_csv_atomic(tmp_path / "steps.csv", [], layout.STEPS_COLUMNS)
        atomic.write_text_atomic(tmp_path / "index.html", "<p>x</p>")
        with atomic.atomic_path(tmp_path / "checkpoint.pt") as tmp:
            tmp.write_bytes(b"x")
    finally:
        os.umask(old)
    names = ["checkpoint.pt", "index.html", "run.json", "steps.csv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == names  # no temp file left
    for name in names:
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name


def test_atomic_path_keeps_the_old_file_when_the_writer_fails(tmp_path: Path):
    target = tmp_path / "checkpoint.pt"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic.atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("writer died")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_write_json_atomic_keeps_old_file_on_failure(tmp_path: Path):
    target = tmp_path / "run.json"
    atomic.write_json_atomic(target, {"ok": True})
    with pytest.raises(ValueError):
        atomic.write_json_atomic(target, {"bad": float("nan")})
    assert json.loads(target.read_text()) == {"ok": True}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_write_csv_atomic_columns_and_none(tmp_path: Path):
    target = tmp_path / "steps.csv"
    rows = [{c: i for i, c in enumerate(layout.STEPS_COLUMNS)}]
    rows[0]["cuda_allocated_bytes"] = None
    atomic.write_csv_atomic(target, rows, layout.STEPS_COLUMNS)
    with target.open() as f:
        read = list(csv.DictReader(f))
    assert list(read[0]) == layout.STEPS_COLUMNS
    assert read[0]["cuda_allocated_bytes"] == "" and read[0]["step"] == "2"
    with pytest.raises(ValueError):
        atomic.write_csv_atomic(target, [{"nope": 1}], layout.STEPS_COLUMNS)
    assert len(target.read_text().splitlines()) == 2  # the earlier file survived


def test_collect_env_fields():
    env = environment.collect_env(threads_per_rank=3)
    assert set(env) == {
        "os",
        "platform",
        "python",
        "torch",
        "cuda",
        "nccl",
        "gpus",
        "cpu_model",
        "cpu_cores",
        "threads_per_rank",
        "hostname",
        "device_memory_bytes",
    }
    assert env["threads_per_rank"] == 3 and env["cpu_cores"] >= 1
    assert re.match(r"\d+\.\d+", env["python"]) and env["torch"]
    assert isinstance(env["gpus"], list)
    json.dumps(env)  # must be serialisable as-is
