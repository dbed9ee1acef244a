"""Serve a runs folder with TensorBoard and its PyTorch profiler plugin, on 127.0.0.1 only.

    python -m workloads.tools.tensorboard runs --port 6006      # what `make tensorboard` runs

The torch-tb-profiler plugin treats every folder holding `*.pt.trace.json(.gz)` files as one
run, named by its path under the logdir (so `runs/<run_id>/traces` shows as `<run_id>/traces`),
and takes each worker (`rank0`, `rank1`, `dp`) from the file name. This wrapper checks that
there is something to show, picks the real `tensorboard` of this interpreter's environment,
binds it to loopback, prints the URL and stops TensorBoard when it is itself stopped.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
from pathlib import Path

from profiler.runfolder.errors import OneLineParser, UserError, run_command
from workloads.launch.child import stop_process

__all__ = ["TensorBoardError", "build_command", "check_port", "find_trace_dirs", "main"]

HOST = "127.0.0.1"  # never expose traces (host names, paths) beyond this machine
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


class TensorBoardError(UserError):
    """A user-facing problem with the arguments; the message is one line saying what to do."""


def find_trace_dirs(logdir: Path) -> list[Path]:
    """Folders under `logdir` that the profiler plugin will show as runs (sorted)."""
    logdir = Path(logdir)
    if not logdir.is_dir():
        raise TensorBoardError(
            f"{logdir}: no such folder; run `make profile-ddp` (or pass RUNS=<folder>)"
        )
    dirs = {p.parent for p in logdir.rglob("*.pt.trace.json*") if p.name.endswith(TRACE_SUFFIXES)}
    if not dirs:
        raise TensorBoardError(
            f"{logdir}: no *.pt.trace.json(.gz) traces in it; profile a run first "
            "(`make profile-ddp`) or point RUNS at a runs folder"
        )
    return sorted(dirs)


def check_port(port: int) -> None:
    """Raise TensorBoardError unless `port` is valid and free on the loopback interface."""
    if not 1 <= port <= 65535:
        raise TensorBoardError(f"--port {port}: must be between 1 and 65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            raise TensorBoardError(
                f"--port {port}: already in use on {HOST}; pass another one (PORT=<n>)"
            ) from None


def build_command(logdir: Path, port: int) -> list[str]:
    """The TensorBoard command line: this environment's tensorboard, loopback only.

    `--load_fast=false` keeps TensorBoard in its Python data path: the profiler plugin is a
    Python plugin, and the Rust data server would only add a second process that reads the
    whole logdir for event files we don't write.
    """
    return [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir",
        str(Path(logdir).resolve()),
        "--host",
        HOST,
        "--port",
        str(port),
        "--load_fast=false",
    ]


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def build_parser(prog: str = "python -m workloads.tools.tensorboard") -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description=__doc__.split("\n\n")[0])
    # A runs folder is a positional, as for `dpscope report` and `dpscope runs`; --logdir (what
    # TensorBoard itself calls it) stays accepted for the same folder.
    parser.add_argument("runs", type=Path, nargs="?", default=None, help="runs folder (RUNS)")
    parser.add_argument("--logdir", type=Path, default=None, help="the same as RUNS")
    parser.add_argument("--port", type=int, default=6006, help="loopback port (PORT)")
    return parser


def main(
    argv: list[str] | None = None, *, prog: str = "python -m workloads.tools.tensorboard"
) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.runs is not None and args.logdir is not None and args.runs != args.logdir:
        parser.error(f"two runs folders given ({args.runs} and --logdir {args.logdir}); pass one")
    args.logdir = args.runs or args.logdir or Path("runs")
    return run_command(prog, lambda: _serve(args))


def _serve(args: argparse.Namespace) -> int:
    runs = find_trace_dirs(args.logdir)
    check_port(args.port)
    print(f"{len(runs)} profiled run(s) under {args.logdir}")
    print(f"TensorBoard: http://{HOST}:{args.port}/#pytorch_profiler  (Ctrl-C to stop)", flush=True)
    # Turn SIGTERM into the same clean shutdown as Ctrl-C, so TensorBoard never outlives us.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    proc = subprocess.Popen(build_command(args.logdir, args.port))
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop_process(proc)


if __name__ == "__main__":
    sys.exit(main())
