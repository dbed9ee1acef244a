"""What each rank of a `--script` run executes: `python -m workloads.launch.bootstrap SCRIPT ARGS`
(torchrun runs it once per rank under `--mode ddp`).

It installs the zero-code instrumentation (profiler.autohooks driving a RunRecorder), then runs
the user's script unchanged with `runpy`: as `__main__`, with `sys.argv = [SCRIPT, *ARGS]` and
the script's own folder first on `sys.path`, in the folder the user launched from. Output is teed
into `logs/rank<r>.log`; the profiler's own log lines (Kineto's, written by C++ straight to the
stderr file descriptor) go to `logs/rank<r>.profiler.log` instead of the terminal
(workloads.launch.kinetolog).

However the script ends, the rank writes its part (profiler.runfolder.parts) with `ended`:

- `ok`: the script returned (or called `sys.exit(0)`);
- `max_steps`: `--max-steps N` stopped it after N optimizer steps (`stop_reason` says so);
- `failed`: it raised or exited non-zero (`exit_code`); `logs/rank<r>.error.json` too
  (workloads.launch.runlog);
- `signal`: SIGINT or SIGTERM reached the rank (`signal`, `signal_time`; exit code 130 / 143).
  The first one stops the script (SIGINT as the KeyboardInterrupt a script expects, SIGTERM as
  `Terminated`); one that arrives while dpscope records a step waits until the step is recorded,
  and any later one is ignored while the part is written, so the rows, the traces already written
  and the cycle cut short are all kept.

The launcher passes its settings in DPSCOPE_SCRIPT (JSON: run_dir, profile, warmup_steps,
samples_per_step, workload, max_steps, collective_timeout), so the script's own arguments stay
untouched. A DDP rank also gets `--collective-timeout` as its process groups' default timeout,
the flight recorder's dumper and a heartbeat (workloads.launch.flightrec); a failing rank dumps
and asks its peers to.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from profiler.autohooks import AutoSteps, HookedRecorder, MaxStepsReached
from profiler.runfolder.parts import write_part
from profiler.session import ProfileConfig
from workloads.launch.flightrec import dump_on_failure, watch_script_rank
from workloads.launch.kinetolog import ProfilerLogFilter
from workloads.launch.runlog import rank_log, write_error_record

__all__ = ["SETTINGS_ENV", "Terminated", "main"]

SETTINGS_ENV = "DPSCOPE_SCRIPT"
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ScriptExit(Exception):
    """The script called sys.exit with a non-zero code."""


class Terminated(BaseException):
    """SIGTERM reached the rank while the script ran."""


class Stopper:
    """SIGINT/SIGTERM while the script runs: record the first and stop the script (see the
    module docstring); `hold()` defers a signal to the end of dpscope's own bookkeeping."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.name: str | None = None
        self.time: float | None = None
        self.armed = False  # the script is running: a signal stops it
        self.holding = False
        self.pending = False

    def install(self) -> None:
        for sig in SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        if os.getpid() != self.pid:  # a forked child (a DataLoader worker): as if never set
            signal.signal(
                signum, signal.SIG_DFL if signum != signal.SIGINT else signal.default_int_handler
            )
            signal.raise_signal(signum)
            return
        if self.name is None:
            self.name, self.time = signal.Signals(signum).name, time.time()
        if not self.armed:
            return  # the part is being written: nothing may cut it short
        if self.holding:
            self.pending = True
            return
        self._raise()

    def _raise(self) -> None:
        if self.name == "SIGINT":
            raise KeyboardInterrupt
        raise Terminated

    @contextmanager
    def hold(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        except BaseException:
            self.holding = False
            raise
        self.holding = False
        if self.pending and self.armed:
            self._raise()

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process its signal ended."""
        return 128 + int(signal.Signals[self.name or "SIGTERM"])


def _exit_code(exc: SystemExit) -> int:
    """What the interpreter would exit with for `sys.exit(code)`."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _run_script(script: Path, args: list[str], stopper: Stopper) -> None:
    sys.argv = [str(script), *args]
    sys.path[0] = str(script.parent)  # as `python SCRIPT` would have it
    stopper.armed = True
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        stopper.armed = False


def _run(script: Path, args: list[str], stopper: Stopper) -> tuple[dict, BaseException | None]:
    """Run the script; (its part's `ending` fields, the failure to record or None)."""
    try:
        _run_script(script, args, stopper)
        ending: dict = {"ended": "ok", "exit_code": 0}
        failure = None
    except MaxStepsReached as exc:
        ending = {"ended": "max_steps", "exit_code": 0,
                  "stop_reason": f"stopped after --max-steps {exc.args[0]}"}  # fmt: skip
        failure = None
    except SystemExit as exc:
        code = _exit_code(exc)
        ending = {"ended": "ok" if code == 0 else "failed", "exit_code": code}
        failure = None if code == 0 else ScriptExit(f"{script.name} exited with code {code}")
    except BaseException as exc:  # noqa: BLE001 - the script's failure is the run's record
        if not isinstance(exc, KeyboardInterrupt | Terminated):
            traceback.print_exc()
        ending, failure = {"ended": "failed", "exit_code": 1}, exc
    if stopper.name is not None:  # a signal stopped it (a peer's error after it is its echo)
        ending = {"ended": "signal", "exit_code": stopper.exit_code, "signal": stopper.name,
                  "signal_time": stopper.time}  # fmt: skip
        failure = None
    return ending, failure


def _stop_process_group() -> None:
    """After --max-steps every rank stops at the same step: leave the group as the script
    would have (a group left for the interpreter's exit makes torch warn)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _close(rec: HookedRecorder, run_dir: Path) -> None:
    """Write this rank's part; if the instruments fail to stop (a signal inside torch's
    profiler), the part is still written from what the recorder holds."""
    try:
        rec.close()
    except Exception:  # noqa: BLE001 - the rows matter more than a clean profiler stop
        traceback.print_exc()
        write_part(run_dir, rec.part())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    settings = json.loads(os.environ[SETTINGS_ENV])
    run_dir = Path(settings["run_dir"])
    rank = int(os.environ.get("RANK", "0"))
    script = Path(argv[0])
    stopper = Stopper()
    stopper.install()
    noise = ProfilerLogFilter(run_dir / "logs" / f"rank{rank}.profiler.log")
    noise.start()
    with rank_log(run_dir / "logs" / f"rank{rank}.log"):
        rec = HookedRecorder(
            run_dir.parent,
            run_dir.name,
            profile=ProfileConfig(**settings["profile"]),
            warmup_steps=settings["warmup_steps"],
            workload=settings.get("workload"),
            assemble=False,
        )
        hooks = AutoSteps(
            rec,
            samples_per_step=settings.get("samples_per_step"),
            max_steps=settings.get("max_steps") or 0,
            guard=stopper.hold,
        )
        hooks.install()
        watch_script_rank(  # --collective-timeout, the flight recorder and the heartbeat
            run_dir,
            rank=rank,
            timeout_s=settings.get("collective_timeout"),
            progress=lambda: (rec.state.step, rec.state.phase or ("data" if rec.in_step else None)),
        )
        ending, failure = _run(script, argv[1:], stopper)
        hooks.remove()
        rec.ending = ending
        _close(rec, run_dir)
        if failure is not None:
            write_error_record(
                run_dir, rank=rank, exc=failure, details={"exit_code": ending["exit_code"]}
            )
            dump_on_failure(f"{type(failure).__name__}: {failure}"[:300])
        if ending["ended"] == "max_steps":
            _stop_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    noise.stop()
    if ending["exit_code"]:
        # Leave at once, as dpscope's own ranks do: peers may block in a collective at exit.
        os._exit(ending["exit_code"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
