"""What each rank of a `--script` run executes: `python -m workloads.launch.bootstrap SCRIPT ARGS`
(torchrun runs it once per rank under `--mode ddp`).

It installs the zero-code instrumentation (profiler.autohooks driving a RunRecorder), then runs
the user's script unchanged with `runpy`: as `__main__`, with `sys.argv = [SCRIPT, *ARGS]` and
the script's own folder first on `sys.path`, in the folder the user launched from. Output is teed
into `logs/rank<r>.log`. At the end, whichever way the script ends, the rank writes its part
(profiler.runfolder.parts); a script that raises or exits non-zero also leaves `logs/rank<r>.error.json`
(workloads.launch.runlog) with its exit code, and the launcher assembles the run folder.

The launcher passes its settings in DPSCOPE_SCRIPT (JSON: run_dir, profile, warmup_steps,
samples_per_step), so the script's own arguments stay untouched.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from pathlib import Path

from profiler.autohooks import AutoSteps
from profiler.recorder import RunRecorder
from profiler.session import ProfileConfig
from workloads.launch.runlog import rank_log, write_error_record

__all__ = ["SETTINGS_ENV", "main"]

SETTINGS_ENV = "DPSCOPE_SCRIPT"


class ScriptExit(Exception):
    """The script called sys.exit with a non-zero code."""


def _exit_code(exc: SystemExit) -> int:
    """What the interpreter would exit with for `sys.exit(code)`."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _run_script(script: Path, args: list[str]) -> None:
    sys.argv = [str(script), *args]
    sys.path[0] = str(script.parent)  # as `python SCRIPT` would have it
    runpy.run_path(str(script), run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    settings = json.loads(os.environ[SETTINGS_ENV])
    run_dir = Path(settings["run_dir"])
    rank = int(os.environ.get("RANK", "0"))
    script = Path(argv[0])
    with rank_log(run_dir / "logs" / f"rank{rank}.log"):
        rec = RunRecorder(
            run_dir.parent,
            run_dir.name,
            profile=ProfileConfig(**settings["profile"]),
            warmup_steps=settings["warmup_steps"],
            workload=settings.get("workload"),
            assemble=False,
        )
        hooks = AutoSteps(rec, samples_per_step=settings.get("samples_per_step"))
        hooks.install()
        code, failure = 0, None
        try:
            _run_script(script, argv[1:])
        except SystemExit as exc:
            code = _exit_code(exc)
            failure = None if code == 0 else ScriptExit(f"{script.name} exited with code {code}")
        except BaseException as exc:  # noqa: BLE001 - the script's failure is the run's record
            traceback.print_exc()
            code, failure = 1, exc
        hooks.remove()
        rec.close()
        if failure is not None:
            write_error_record(run_dir, rank=rank, exc=failure, details={"exit_code": code})
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        # Leave at once, as dpscope's own ranks do: peers may block in a collective at exit.
        os._exit(code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
