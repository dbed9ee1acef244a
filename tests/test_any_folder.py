"""Issue 21 item 1: dpscope's commands work from any folder. Run from a temp folder outside the
repository with only PYTHONPATH pointing at it (as a pip or notebook user would), `dpscope
profile` and the launcher write exactly where a relative path asks, and nothing into the repo
(the sweep: tests/test_sweep.py; bench-comm: tests/test_project_runs.py, from such folders too).
Real launcher, real torchrun (gloo) on CPU, tiny sizes."""

from __future__ import annotations

import ast
import csv
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import REPO, in_repo, read_run
from tests.source_trees import parse_file
from workloads.launch import launcher
from workloads.launch.child import PACKAGE_ROOT, child_env, user_path

TINY = "--model mlp --dataset synthetic --max-steps 3 --batch-size 16 --no-profile --device cpu"


def _from(
    folder: Path, module: str, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` run in `folder` with only PYTHONPATH naming the repository."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _nothing_in_repo(*names: str) -> None:
    """No file or folder of these names appeared anywhere in the repository."""
    found = in_repo(*names)
    assert not found, f"written into the repository: {found}"


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working folder outside the repository."""
    folder = tmp_path / "user folder"  # a space, as users' folders have
    folder.mkdir()
    assert not folder.resolve().is_relative_to(REPO.resolve())
    return folder


# `dpscope profile` (the launcher inside the dpscope command) and the launcher itself.
COMMANDS = {
    "af-single": "workloads.tools.cli profile --mode single".split(),
    "af-ddp": "workloads.launch --mode ddp --backend gloo --nproc 2".split(),
}


@pytest.fixture(scope="module")
def from_elsewhere(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Each of COMMANDS run from its own folder outside the repository (a space in its name),
    both at once: {run id: (that folder, the finished process)}."""
    folders = {}
    for rid in COMMANDS:
        folders[rid] = tmp_path_factory.mktemp(rid) / "user folder"
        folders[rid].mkdir()
        assert not folders[rid].resolve().is_relative_to(REPO.resolve())

    def run(rid: str) -> subprocess.CompletedProcess:
        module, *mode = COMMANDS[rid]
        args = [*mode, "--runs-dir", "runs_x", "--run-id", rid, *TINY.split()]
        return _from(folders[rid], module, *args)

    with ThreadPoolExecutor(max_workers=len(COMMANDS)) as pool:
        futures = {rid: pool.submit(run, rid) for rid in COMMANDS}
    return {rid: (folders[rid], future.result()) for rid, future in futures.items()}


@pytest.mark.parametrize("rid", list(COMMANDS))
@pytest.mark.integration
def test_the_launcher_writes_an_ok_run_folder_where_a_relative_runs_dir_says(from_elsewhere, rid):
    elsewhere, proc = from_elsewhere[rid]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = elsewhere / "runs_x" / rid
    run = read_run(run_dir)
    assert run["status"] == "ok", run["error"]
    assert run["config"]["world_size"] == (2 if "ddp" in COMMANDS[rid] else 1)
    with open(run_dir / "steps.csv", newline="") as f:
        ranks = {row["rank"] for row in csv.DictReader(f)}
    assert len(ranks) == run["config"]["world_size"]  # every rank wrote its steps there
    # The child was started with the absolute folder, so nothing depends on its cwd guess.
    command = (run_dir / "logs" / "launcher.log").read_text().splitlines()[0]
    assert f"--runs-dir {run_dir.parent}" in command
    assert f"run folder: {run_dir}  status: ok" in proc.stdout
    assert sorted(p.name for p in elsewhere.iterdir()) == ["runs_x"]
    _nothing_in_repo("runs_x", rid)


def test_user_paths_are_resolved_against_the_users_folder_once(elsewhere, monkeypatch):
    """--runs-dir, --data-dir and --rdzv-file reach the plan and the training absolute."""
    monkeypatch.chdir(elsewhere)
    seen = []
    monkeypatch.setattr(launcher, "_execute", lambda cfg, *_: seen.append(cfg) or "ok")
    argv = ["--mode", "ddp", "--backend", "gloo", "--nproc", "2", *TINY.split()]
    argv += ["--runs-dir", "r", "--data-dir", "../d", "--rdzv-file", "rdzv/file"]
    assert launcher.main(argv) == 0
    (cfg,) = seen
    assert cfg.runs_dir == str(elsewhere / "r")
    assert cfg.data_dir == str(elsewhere.parent / "d")
    assert cfg.init_method == (elsewhere / "rdzv" / "file").as_uri()
    assert user_path("x/../y") == elsewhere / "y"


def test_a_missing_dataset_names_the_folder_the_user_meant(elsewhere, monkeypatch, capsys):
    monkeypatch.chdir(elsewhere)
    argv = [*TINY.replace("synthetic", "cifar10").split(), "--data-dir", "mydata"]
    assert launcher.main([*argv, "--runs-dir", "r"]) == 2
    assert str(elsewhere / "mydata") in capsys.readouterr().err
    assert not (elsewhere / "r").exists()


def test_child_env_puts_dpscope_first_and_keeps_the_users_path(tmp_path):
    theirs = os.pathsep.join(["/their/lib", str(PACKAGE_ROOT), "", "rel"])
    env = child_env({"PYTHONPATH": theirs, "HOME": "/h"}, PYTHONUNBUFFERED="1")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(PACKAGE_ROOT), "/their/lib", "rel"]
    assert (env["HOME"], env["PYTHONUNBUFFERED"]) == ("/h", "1")
    assert child_env({})["PYTHONPATH"] == str(PACKAGE_ROOT)
    assert PACKAGE_ROOT == REPO.resolve()


def test_an_installed_dpscope_is_not_put_ahead_of_the_standard_library(monkeypatch):
    """Installed into site-packages, dpscope imports without PYTHONPATH; prepending
    site-packages would put it before the standard library, so the user's PYTHONPATH stays."""
    import site

    monkeypatch.setattr(site, "getsitepackages", lambda: [str(PACKAGE_ROOT)])
    assert child_env({"PYTHONPATH": "/their/lib"})["PYTHONPATH"] == "/their/lib"
    assert "PYTHONPATH" not in child_env({})


@pytest.mark.integration
def test_a_child_imports_dpscope_and_the_users_own_module_from_the_users_folder(tmp_path):
    """What the launcher gives its children: the user's folder as cwd (first on sys.path under
    `python -m`) and dpscope through PYTHONPATH, so a user's module can import both."""
    (tmp_path / "my_model.py").write_text(
        "import json, os, workloads.config as c\nprint(json.dumps([os.getcwd(), c.__file__]))\n"
    )
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "my_model"],
        cwd=tmp_path,
        env=child_env(clean),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    cwd, config_file = json.loads(proc.stdout)
    assert Path(cwd) == tmp_path
    assert Path(config_file).resolve() == PACKAGE_ROOT / "workloads" / "config.py"


def test_no_command_starts_its_children_in_the_repository():
    """The rule, not case by case: outside the tests no call passes `cwd=` and no module keeps a
    REPO path of its own (PACKAGE_ROOT in workloads.launch.child is the one place)."""
    offenders = []
    # Each top folder of the clone but the tests and the virtual environment (walking into a
    # .venv reads every installed package's sources).
    tops = [p for p in sorted(REPO.iterdir()) if p.is_dir() and p.name not in {"tests", ".venv"}]
    for path in sorted(p for top in tops for p in top.rglob("*.py")):
        for node in ast.walk(parse_file(path)):
            cwd = isinstance(node, ast.Call) and any(k.arg == "cwd" for k in node.keywords)
            repo = isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "REPO" for t in node.targets
            )
            if cwd or repo:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders
