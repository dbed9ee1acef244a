"""Shared fixtures: real run folders, copied from the committed golden set (tests/data/golden/,
made by the real launcher and torchrun with `make golden`), or made fresh once per session.

The analysis, report and hostile-input tests read the golden copies instead of training, so the
suite stays under 10 minutes on 2 cores; tests of training itself start real processes.

Markers (pyproject.toml): a test that starts a process (a subprocess, or a session fixture made by
one) must be marked `integration`, `browser` or `gpu`; an unmarked one that tries fails at once
with that message, so `make test-fast` (the unmarked tests) stays a fast, process-free loop.
"""

from __future__ import annotations

import io
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import nullcontext, redirect_stderr, redirect_stdout
from pathlib import Path
from unittest.mock import patch

import pytest

# Done once here: torch's first import probes libraries with `ldconfig -p` and platform's first
# processor() runs `uname -p` (processes, cached after), which must not be charged to whichever
# unmarked test happens to come first.
import torch  # noqa: F401

from bench import golden
from profiler.runfolder.layout import RUN_JSON
from profiler.runfolder.records import read_comm_record, read_record, record_kind

REPO = Path(__file__).resolve().parents[1]
# Reference traces from other public projects (origin, licence, their tools outputs: README.md).
DATA = REPO / "tests" / "data"


platform.processor()

PROCESS_MARKS = ("integration", "browser", "gpu")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--gpu-runs-dir",
        default=None,
        help="keep the gpu tests' run folders here (make gpu-check: RUNS/gpu-check)",
    )


def _refuse_process(item: pytest.Item):
    def refuse(*_args, **_kwargs):
        raise RuntimeError(
            f"{item.nodeid} starts a process: mark it @pytest.mark.integration "
            "(make test-fast runs only tests that start none)"
        )

    return refuse


def _process_guard(item: pytest.Item):
    if any(item.get_closest_marker(m) for m in PROCESS_MARKS):
        return nullcontext()
    # Popen._execute_child is where subprocess.run/Popen/check_output start the child.
    return patch.object(subprocess.Popen, "_execute_child", _refuse_process(item))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _process_guard(item):  # fixtures too: a session run made for an unmarked test
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _process_guard(item):
        yield


# Session fixtures of real run folders (copies of the golden set, made by the launcher, torchrun
# and bench-comm, or fresh runs made now): a test that uses one is an integration test without
# saying so.
PROCESS_FIXTURES = {
    "runs_dir",
    "single_mlp_run",
    "ddp_mlp_run",
    "comm_run",
    "failed_run",
    "fresh_golden",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """browser and gpu tests, and tests using a process-made fixture, count as integration."""
    for item in items:
        if "browser" in getattr(item, "fixturenames", ()):  # the fixture starts Chromium
            item.add_marker(pytest.mark.browser)
        uses = PROCESS_FIXTURES & set(getattr(item, "fixturenames", ()))
        if uses or item.get_closest_marker("browser") or item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.integration)


def run_in_repo(
    cmd: list[str], *, timeout: float = 120, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `cmd` from the repo root with text output captured; return the finished process."""
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def in_process(
    main: Callable[[list[str]], int | None], argv: list[str]
) -> subprocess.CompletedProcess:
    """A command's `main(argv)` run in this process, as `python -m ...` would run it but without
    an interpreter and its imports: its exit code (argparse's SystemExit too) and what it printed
    to stdout and stderr, in the shape subprocess.run returns."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    code = 0 if code is None else code if isinstance(code, int) else 1
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def launch(
    args: list[str], *, timeout: float = 240, check: bool = True, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `python -m workloads.launch ARGS` from the repo root (`env`: extra variables, e.g. a
    test hook); return the finished process."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = run_in_repo([sys.executable, "-m", "workloads.launch", *args], timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"launcher failed ({proc.returncode})\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"
        )
    return proc


def in_repo(*names: str) -> list[Path]:
    """Files or folders of these names anywhere in the repository, outside .git and .venv (a
    walk that skips those trees: in CI the venv is a folder of the clone)."""
    found = []
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in (".git", ".venv")]
        found += [Path(folder) / n for n in (*dirs, *files) if n in names]
    return found


def free_port() -> int:
    """A loopback TCP port free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_run(run_dir: Path) -> dict:
    """run.json as written, once the typed reader (profiler.runfolder.records) has accepted it: every test
    that reads a real run folder also checks that its writer keeps the run-folder contract."""
    path = run_dir / RUN_JSON
    reader = read_comm_record if record_kind(path) == "comm" else read_record
    _, raw = reader(path)
    assert raw == json.loads(path.read_text()), "the typed reader must not change the record"
    return raw


# The tiny profiled workload of the golden training runs (a list of launcher arguments). On CPU
# even where a GPU exists, so the suite checks the same thing on every machine.
TINY = list(golden.TINY)
GOLDEN = golden.GOLDEN


def copy_golden(name: str, runs: Path) -> Path:
    """A copy of the committed golden run folder `name` (tests/data/golden/, `make golden`) as
    runs/name: tests may edit their copy, never the committed one."""
    src = GOLDEN / name
    if not (src / RUN_JSON).is_file():
        raise FileNotFoundError(f"{src}: no golden run folder; run `make golden` and commit it")
    shutil.copytree(src, runs / name)
    return runs / name


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def single_mlp_run(runs_dir: Path) -> Path:
    """A profiled single-device MLP run (8 steps, global batch 64): a copy of the golden
    `single-mlp`, made by the real launcher (`make golden`), in the session's runs_dir."""
    return copy_golden("single-mlp", runs_dir)


@pytest.fixture(scope="session")
def ddp_mlp_run(runs_dir: Path) -> Path:
    """A profiled 2-rank gloo DDP MLP run through torchrun (8 steps, global batch 64, the same
    workload as single_mlp_run): a copy of the golden `ddp-gloo-mlp` in runs_dir."""
    return copy_golden("ddp-gloo-mlp", runs_dir)


@pytest.fixture(scope="session")
def comm_run(tmp_path_factory) -> Path:
    """A real 2-rank gloo comm benchmark (`dpscope bench-comm`) with tiny sizes, few iterations
    and a short idle sweep: a copy of the golden `comm-gloo`, alone in its runs folder."""
    return copy_golden("comm-gloo", tmp_path_factory.mktemp("comm"))


@pytest.fixture(scope="session")
def failed_run(tmp_path_factory) -> Path:
    """The DDP workload with rank 1 crashing at step 2 (status failed, its error record and
    logs): a copy of the golden `failed-ddp-mlp`, alone in its runs folder."""
    return copy_golden("failed-ddp-mlp", tmp_path_factory.mktemp("failed"))


# The fresh training runs also save checkpoint.pt, which the equivalence tests compare; it is
# the one file a fresh folder has beyond its golden one.
FRESH_EXTRA = {"single-mlp": ("--checkpoint",), "ddp-gloo-mlp": ("--checkpoint",)}


class FreshRuns:
    """`fresh(name)`: golden run `name` made now by the real launcher, as `make golden` makes it
    (plus FRESH_EXTRA), into one folder, once per session; `fresh.output(name)`: its stdout.
    The first call makes every golden run at once (bench.golden.make_runs): together they take
    two cores' worth of the time one after another takes."""

    def __init__(self, runs: Path) -> None:
        self.runs, self._out = runs, {}

    def __call__(self, name: str) -> Path:
        if not self._out:
            wanted = {n: FRESH_EXTRA.get(n, ()) for n in golden.GOLDEN_RUNS}
            made = golden.make_runs(wanted, self.runs)
            self._out = {n: proc.stdout for n, proc in made.items()}
        return self.runs / name

    def output(self, name: str) -> str:
        self(name)
        return self._out[name]


@pytest.fixture(scope="session")
def fresh_golden(tmp_path_factory) -> FreshRuns:
    """Golden runs made now (FreshRuns): the golden schema test compares each with its committed
    folder, and the tests of what training and bench-comm write read them."""
    return FreshRuns(tmp_path_factory.mktemp("fresh"))


def no_torch_env(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import torch` raises ImportError, as on a machine without torch
    (a `torch` package first on PYTHONPATH that refuses to load); the repo stays importable."""
    shim = tmp_path / "no-torch"
    (shim / "torch").mkdir(parents=True, exist_ok=True)
    (shim / "torch" / "__init__.py").write_text(
        'raise ImportError("torch is blocked: this code must run without torch")\n'
    )
    path = os.pathsep.join([str(shim), str(REPO), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path.rstrip(os.pathsep))
