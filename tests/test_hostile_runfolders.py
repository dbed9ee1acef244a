"""Hostile input v4 (issue 36), the run-folder class: no run is overwritten and none is written
outside its folder. One run-id rule for every writer and every way an id arrives (--run-id,
bench-comm, tune, RunRecorder, DPSCOPE_RUN_ID); run folders created exclusively, so two writers
started together never share one (two real launchers race for one id); nothing dpscope did not
create is deleted (--rdzv-file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from profiler.runfolder.layout import (
    MAX_RUN_ID_BYTES,
    RunFolderError,
    RunFolderTaken,
    create_run_folder,
    validate_run_id,
)
from profiler.runfolder.lease import OWNER_JSON, owner_gone
from tests.conftest import REPO, read_run
from workloads.comm import bench
from workloads.config import TrainConfig
from workloads.launch import launcher

FAST = "--model mlp --dataset synthetic --max-steps 4 --batch-size 32 --no-profile --device cpu"

BAD_IDS = {  # id -> words of the refusal
    "..": "names the runs folder or its parent",
    ".": "names the runs folder or its parent",
    "../x": "a folder name, not a path",
    "a\\b": "a folder name, not a path",
    "a\nb": "holds a control character",
    "tab\there": "holds a control character",
    "nul\0": "holds a control character",
    "x" * (MAX_RUN_ID_BYTES + 1): f"over the {MAX_RUN_ID_BYTES}-byte limit",
    "é" * 65: "130 bytes long",  # 65 characters, 130 bytes of UTF-8
}


@pytest.mark.parametrize("run_id", list(BAD_IDS), ids=range(len(BAD_IDS)))
def test_the_run_id_rule(run_id):
    with pytest.raises(RunFolderError, match="--run-id") as err:
        validate_run_id(run_id)
    assert BAD_IDS[run_id] in str(err.value) and "\n" not in str(err.value)
    assert validate_run_id("single-mlp.s0_2024") == "single-mlp.s0_2024"


def _nothing_outside(tmp_path: Path, before: set[str]) -> None:
    assert {p.name for p in tmp_path.iterdir()} == before  # not even the runs folder


@pytest.mark.parametrize("run_id", ["..", ".", "../../escape"])
def test_every_writer_refuses_an_escaping_id(run_id, tmp_path, capsys, monkeypatch):
    """--run-id .. wrote the run into the runs folder's parent, --run-id . turned the runs folder
    into a run folder; the same for bench-comm, RunRecorder and DPSCOPE_RUN_ID."""
    from profiler import RunRecorder

    runs, before = tmp_path / "runs", set()
    assert launcher.main([*FAST.split(), "--run-id", run_id, "--runs-dir", str(runs)]) == 2
    assert bench.main(["--backend", "gloo", "--run-id", run_id, "--runs-dir", str(runs)]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and all("--run-id" in e for e in errors), errors
    with pytest.raises(RunFolderError, match=r"RunRecorder\(run_id=\.\.\.\)"):
        RunRecorder(runs_dir=runs, run_id=run_id)
    monkeypatch.setenv("DPSCOPE_RUN_ID", run_id)
    with pytest.raises(RunFolderError, match="DPSCOPE_RUN_ID"):
        RunRecorder(runs_dir=runs)
    _nothing_outside(tmp_path, before)


def test_a_run_folder_is_created_once(tmp_path):
    first = create_run_folder(tmp_path, "x", writer="test")
    owner = json.loads((first / OWNER_JSON).read_text())
    assert owner["pid"] == os.getpid() and owner["writer"] == "test"
    with pytest.raises(RunFolderTaken, match="already holds a run; pick another --run-id"):
        create_run_folder(tmp_path, "x", writer="test")
    old = tmp_path / "older"  # a run folder from before owner.json: its run.json is enough
    old.mkdir()
    (old / "run.json").write_text("{}")
    with pytest.raises(RunFolderTaken):
        create_run_folder(tmp_path, "older", writer="test")
    assert owner_gone(first) is None  # this process is alive


def test_of_many_writers_at_once_exactly_one_gets_the_folder(tmp_path):
    results: list[str] = []
    start = threading.Barrier(16)

    def writer() -> None:
        start.wait()
        try:
            create_run_folder(tmp_path, "same", writer="test")
            results.append("won")
        except RunFolderTaken:
            results.append("taken")

    threads = [threading.Thread(target=writer) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["taken"] * 15 + ["won"]


def test_a_default_id_that_is_taken_gets_a_suffix(tmp_path):
    """Two launches in the same second with the same config share a default id: the second gets
    `<id>-2` (and says so in cfg.run_id, what run.json records), a given id is refused."""
    ids = []
    for _ in range(2):
        cfg = TrainConfig(runs_dir=str(tmp_path), run_id="single-x-20240101T000000")
        ids.append(launcher.claim_run_dir(cfg, given=False).name)
        assert cfg.run_id == ids[-1]
    assert ids == ["single-x-20240101T000000", "single-x-20240101T000000-2"]
    with pytest.raises(RunFolderTaken):
        launcher.claim_run_dir(TrainConfig(runs_dir=str(tmp_path), run_id=ids[0]), given=True)


@pytest.mark.parametrize("kind", ["file", "folder", "mode-single"])
def test_the_rendezvous_file_is_never_deleted(kind, tmp_path, capsys):
    """--rdzv-file PATH deleted an existing file at PATH, even with --mode single."""
    path = tmp_path / "precious"
    if kind == "folder":
        path.mkdir()
    else:
        path.write_text("not dpscope's")
    mode = ["--mode", "single"] if kind == "mode-single" else ["--mode", "ddp", "--backend", "gloo"]
    runs = tmp_path / "runs"
    argv = [*FAST.split(), *mode, "--rdzv-file", str(path), "--runs-dir", str(runs)]
    assert launcher.main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    words = {
        "file": "already exists (an earlier run's, or not dpscope's at all)",
        "folder": "is a folder; name a file that does not exist yet",
        "mode-single": "--mode single has none",
    }
    assert words[kind] in line
    assert path.is_dir() if kind == "folder" else path.read_text() == "not dpscope's"
    assert not runs.exists()


_RACE = (
    "--model mlp --dataset synthetic --max-steps 3 --warmup-steps 1 --batch-size 32 --device cpu"
)
_RACE += " --profile-wait 0 --profile-warmup 0 --profile-active 1 --threads 1 --run-id same"


@pytest.mark.integration
def test_two_launchers_with_one_run_id_started_together(tmp_path):
    """Both used to exit 0 into one folder, one record replacing the other and their traces
    mixed. Now exactly one runs; the other is one line and leaves the winner's folder alone."""
    cmd = [sys.executable, "-m", "workloads.launch", *_RACE.split(), "--runs-dir", str(tmp_path)]
    procs = [
        subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    loser = outs[[p.returncode for p in procs].index(2)][1]
    (line,) = [ln for ln in loser.splitlines() if ln.strip()]
    assert "already holds a run; pick another --run-id" in line and "Traceback" not in loser
    run = read_run(tmp_path / "same")
    assert run["status"] == "ok" and len(run["traces"]) == 1
    assert [p.name for p in (tmp_path / "same" / "traces").iterdir()] == [
        Path(run["traces"][0]).name
    ]
