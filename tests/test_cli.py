"""The `dpscope` command (workloads/tools/cli.py): every subcommand listed and reachable, one error
line with exit code 2 for bad input, a traceback only for bugs, torch never imported by the
analysis commands, and runs landing where asked from any folder."""

from __future__ import annotations

import importlib
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from profiler.runfolder.errors import UserError, import_main, run_command
from tests.conftest import DATA, REPO, no_torch_env
from workloads.tools.cli import COMMANDS, command_parser
from workloads.tools.cli import main as dpscope

ISSUE_COMMANDS = (
    "profile sweep tune bench-comm report runs traces merge ops diff flightrec project tensorboard"
    " demo"
).split()


def run_dpscope(args: list[str], *, cwd: Path, env: dict | None = None, timeout: float = 240):
    """`dpscope ARGS` as a user runs it from `cwd` (the repo importable as after `pip install`)."""
    env = dict(env or os.environ)
    env.setdefault("PYTHONPATH", str(REPO))
    cmd = [sys.executable, "-m", "workloads.tools.cli", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _exit_code(args: list[str]) -> int:
    """dpscope's exit code, whether it returned it or argparse exited with it."""
    try:
        return dpscope(args)
    except SystemExit as exit_:
        return exit_.code


def test_every_issue_command_is_registered_and_has_its_module() -> None:
    assert list(COMMANDS) == ISSUE_COMMANDS
    for name, command in COMMANDS.items():
        module = importlib.import_module(command.module)
        assert callable(module.main), name
        parser = command_parser(name)
        assert parser.prog == f"dpscope {name}", (name, parser.prog)
        assert parser.format_help().startswith(f"usage: dpscope {name}"), name


def test_help_lists_every_command(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        dpscope(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for name, command in COMMANDS.items():
        assert f"  {name} " in out and command.help in out, name


def test_no_command_and_unknown_command_are_one_line_or_the_list(capsys) -> None:
    assert dpscope([]) == 2
    assert "profile" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        dpscope(["profiel"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dpscope: error: ") and "profiel" in err


def test_a_user_error_is_one_line_with_exit_2_and_a_bug_keeps_its_traceback(capsys) -> None:
    def bad_input() -> int:
        raise UserError("--runs-dir x: not a folder — pass a folder")

    assert run_command("dpscope x", bad_input) == 2
    assert (
        capsys.readouterr().err == "dpscope x: error: --runs-dir x: not a folder — pass a folder\n"
    )

    def bug() -> int:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        run_command("dpscope x", bug)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["runs", "nope"], "nope: no readable run folders"),
        (["traces", "nope"], "nope"),
        (["report", "nope", "--out", "out"], "nope"),
        (["tensorboard", "--logdir", "nope"], "nope"),
    ],
)
def test_bad_input_of_each_analysis_command_is_one_prefixed_line(
    args, words, tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths are the user's: here, none of them exist
    code = _exit_code(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"dpscope {args[0]}: error: "), err
    assert words in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["profile", "--bogus"], "unrecognized arguments: --bogus"),
        (["profile", "--mode", "ddp", "--batch-size", "0"], "--batch-size"),
        (["demo", "--bogus", "1"], "unknown option(s) --bogus 1"),
        (["sweep", "--modes", "single", "--bogus"], "unknown option(s) --bogus"),
        (["tune", "--trials", "0"], "TRIALS (--trials) must be >= 1"),
        (["bench-comm", "--sizes", "2"], "--sizes must be a byte count from 4"),
    ],
)
def test_an_unknown_option_or_bad_value_is_one_line_before_anything_starts(
    args, words, tmp_path, capsys
) -> None:
    """Today `python -m workloads.launch --bogus` reached the trainer after a `failed` run folder
    existed: now nothing is created (checked in-process, so no child can have started)."""
    runs = tmp_path / "runs"
    assert _exit_code([*args, "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"dpscope {args[0]}: error: "), err
    assert words in err
    assert not runs.exists()


def test_help_report_runs_and_traces_never_import_torch(single_mlp_run, tmp_path) -> None:
    """With a `torch` that can't be imported, as on a machine without it."""
    env = no_torch_env(tmp_path)
    runs = single_mlp_run.parent
    for args in (
        ["--help"],
        ["report", "--help"],
        ["runs", str(runs), "--no-traces", "--no-progress"],
        ["traces", str(DATA / "hta" / "trace_filter"), "--no-progress"],
        ["report", str(runs), "--out", str(tmp_path / "report"), "--no-progress"],
    ):
        proc = run_dpscope(args, cwd=tmp_path, env=env)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "torch is blocked" not in proc.stderr
    assert (tmp_path / "report" / "index.html").is_file()
    # The check can fail: a command that needs torch says so under the same environment.
    proc = run_dpscope(["profile", "--help"], cwd=tmp_path, env=env)
    assert proc.returncode != 0 and "torch is blocked" in proc.stderr


@pytest.mark.parametrize(
    "module", ["workloads.launch", "analysis", "analysis.report", "workloads.tools.sweep"]
)
def test_the_old_module_entry_points_still_work(module, monkeypatch, capsys) -> None:
    """`python -m MODULE --help`: each module's __main__ run as `python -m` runs it (runpy), in
    this process."""
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    for name in (module, f"{module}.__main__"):  # imported earlier: runpy would warn
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert exit_.value.code in (0, None), module
    assert capsys.readouterr().out.startswith("usage: python -m"), module


# What each entry point loads before its Ctrl-C guard (import_main) runs: the packages above its
# module, the console script's own module, and the guard's.
ENTRY_PACKAGES = (
    "analysis analysis.report workloads workloads.launch workloads.train workloads.tools"
    " workloads.tools.cli profiler profiler.runfolder profiler.runfolder.errors"
).split()
HEAVY = ("torch", "numpy", "pandas", "jinja2", "matplotlib", "pyarrow", "msgspec")


@pytest.mark.integration
def test_every_entry_point_loads_nothing_heavy_before_its_ctrl_c_guard() -> None:
    """Ctrl-C while pandas or torch loads is one line only if the guard is already running: so
    nothing heavy may load with the packages above the entry points."""
    code = f"import sys\nfor m in {ENTRY_PACKAGES!r}: __import__(m)\n"
    code += f"print([m for m in {HEAVY!r} if m in sys.modules])"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", (proc.stdout, proc.stderr)
    # The check can fail: the API itself does load pandas.
    code = "import sys, analysis; analysis.load_runs; print('pandas' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.stdout.strip() == "True", proc.stderr


def test_ctrl_c_while_a_command_loads_is_one_line_with_exit_130(tmp_path, monkeypatch, capsys):
    """A module whose import is interrupted (as a real Ctrl-C inside `import pandas` is)."""
    (tmp_path / "slow_to_load.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        import_main("slow_to_load", "dpscope x")
    assert exit_.value.code == 130
    err = capsys.readouterr().err
    assert err == "dpscope x: interrupted (Ctrl-C) while loading — nothing was written\n"
    from analysis.cli import report

    assert import_main("analysis.cli.report", "x") is report.main
