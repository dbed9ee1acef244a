"""Hostile input v4 (issue 36), the disk class: a runs folder on a full disk (a real tmpfs), a
read-only one, one the user may not write, a name too long for the file system, and a folder
that is a file each cost one line naming the path, never a traceback. A run that cannot finish
writing ends `failed` with `error.kind: "disk"`, and a half-written trace never stays behind
under a name any reader lists.

The mounts need root (as in CI containers here); elsewhere those tests are skipped, saying why.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.runs.compare import compare_runs
from analysis.trace.folder import find_trace_files
from profiler.runfolder.errors import DiskError
from profiler.runfolder.layout import create_run_folder
from tests.conftest import launch, read_run
from workloads.launch import launcher

FAST = "--model mlp --dataset synthetic --max-steps 4 --batch-size 32 --no-profile --device cpu"


def _mount(where: Path, options: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (a real full / read-only disk)")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode})")


@pytest.fixture
def tmpfs(tmp_path):
    """mount(options) -> a fresh tmpfs under tmp_path, unmounted afterwards."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        where = tmp_path / f"tmpfs{len(mounted)}"
        _mount(where, options)
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.integration
def test_a_full_disk_fails_the_run_as_disk_and_leaves_no_truncated_trace(tmpfs):
    """A runs folder on a full disk raised a traceback, left run.json `running` forever and a
    truncated trace .gz. 64 KiB holds the records and logs of a tiny run, not its trace."""
    runs = tmpfs("size=64k")
    args = FAST.replace("--no-profile", "--profile-wait 0 --profile-warmup 0 --profile-active 2")
    proc = launch([*args.split(), "--run-id", "full", "--runs-dir", str(runs)], check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out
    run = read_run(runs / "full")
    assert run["status"] == "failed" and run["error"]["kind"] == "disk", run["error"]
    assert "no space left on the device (ENOSPC)" in run["error"]["message"]
    assert "/traces/rank0." in run["error"]["message"]  # it names the file it could not write
    assert not list((runs / "full" / "traces").iterdir())  # no partial trace left behind
    (entry,) = compare_runs([runs], progress=False)["runs"]
    assert entry["status"] == "failed" and entry["trace_files"] == []


@pytest.mark.integration
def test_a_read_only_runs_folder_is_one_line(tmpfs):
    runs = tmpfs("ro,size=64k")
    proc = launch([*FAST.split(), "--runs-dir", str(runs / "r")], check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert f"{runs / 'r'}: the file system is read-only (EROFS)" in line


def _as_nobody(folder: str, queue) -> None:
    """In a forked child: drop root, then try to make a run folder in `folder`."""
    os.setgid(65534)
    os.setuid(65534)
    try:
        create_run_folder(folder, "x", writer="test")
        queue.put("created")
    except DiskError as err:
        queue.put(f"{err.errno}|{err}")


@pytest.mark.integration
def test_a_folder_the_user_may_not_write_is_one_line(tmp_path):
    """EACCES needs a user without the permission: root ignores the mode bits, so a forked child
    drops to `nobody` (a real permission check, in a real process)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    tmp_path.chmod(0o755)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_as_nobody, args=(str(locked / "runs"), queue))
    child.start()
    child.join(timeout=60)
    code, _, text = queue.get(timeout=60).partition("|")
    assert int(code) == errno.EACCES, text
    assert f"{locked / 'runs'}: permission denied (EACCES)" in text
    assert not list(locked.iterdir())


@pytest.mark.parametrize(
    ("runs", "words"),
    [
        ("/proc/dpscope-runs", "/proc/dpscope-runs: a folder on the way does not exist"),
        ("{tmp}/" + "n" * 300, "the name is too long for the file system (ENAMETOOLONG)"),
        ("{tmp}/file/runs", "is a file, not a folder"),
    ],
)
def test_runs_folders_that_cannot_hold_runs_are_one_line(runs, words, tmp_path, capsys):
    """`--runs-dir /proc` and a 300-character name raised tracebacks."""
    (tmp_path / "file").write_text("x")
    runs = runs.replace("{tmp}", str(tmp_path))
    assert launcher.main([*FAST.split(), "--runs-dir", runs]) == 2
    err = capsys.readouterr().err
    (line,) = err.splitlines()
    assert words in line and "Traceback" not in err


def test_a_partial_trace_is_never_listed(tmp_path):
    """What the profiler session writes while a trace is being exported (`.<name>.partial.gz`)
    matches no reader's pattern: not the analysis's, not the run folder's TRACE_GLOB."""
    from profiler.runfolder.layout import TRACE_GLOB

    (tmp_path / "rank0.1.pt.trace.json.gz").write_bytes(b"")
    (tmp_path / ".rank0.2.pt.trace.json.gz.partial.gz").write_bytes(b"")
    assert [p.name for p in find_trace_files(tmp_path)] == ["rank0.1.pt.trace.json.gz"]
    assert [p.name for p in tmp_path.glob(TRACE_GLOB)] == ["rank0.1.pt.trace.json.gz"]


def test_the_disk_error_names_the_path_and_the_fault(tmp_path):
    with pytest.raises(DiskError) as err:
        create_run_folder(tmp_path / ("d" * 300), "x", writer="test")
    assert str(err.value).startswith(str(tmp_path / ("d" * 300)))
    assert "(ENAMETOOLONG)" in str(err.value) and "\n" not in str(err.value)
    assert sys.platform != "linux" or err.value.errno == errno.ENAMETOOLONG
