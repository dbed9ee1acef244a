"""The `dpscope` command: one console script, one subcommand per tool, each imported only when it
runs (so `dpscope --help`, `report`, `runs` and `traces` never import torch).

Each subcommand is the module behind today's `python -m ...` entry point, called with the rest of
the command line and `prog="dpscope <name>"`, so it takes the same options, prints the same help
and reports bad input the same way: one `dpscope <name>: error: <message>` line and exit code 2
(profiler.runfolder.errors.run_command); a bug keeps its traceback. Paths are relative to the folder the
command runs in.

Nothing imports this module, so its lazy imports (`importlib`, by module name) can't close a cycle;
tests/test_cli.py checks that every module named here exists and has `main`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from importlib import metadata

from profiler.runfolder.errors import OneLineParser, import_main

__all__ = ["COMMANDS", "Command", "build_parser", "command_parser", "main"]

# The analysis CLI's subcommands (analysis/cli/main.py): dpscope reuses its parsers.
ANALYSIS_MAIN = "analysis.cli.main"


@dataclass(frozen=True, kw_only=True)
class Command:
    """One `dpscope` subcommand."""

    name: str
    module: str
    """Module with `main(argv, *, prog)` (and `build_parser(prog)`), imported only to run it."""
    help: str
    """One line for `dpscope --help`."""
    torch_free: bool = False
    """Runs without importing torch (tests/test_cli.py checks it with a torch that can't load)."""


COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        Command(
            name="profile",
            module="workloads.launch.launcher",
            help="profile one training as single-device, DataParallel and/or DDP runs",
        ),
        Command(
            name="sweep",
            module="workloads.tools.sweep",
            help="run a workload over modes x backends x world sizes x seeds",
        ),
        Command(name="tune", module="workloads.tools.tune", help="measure the DDP knobs"),
        Command(
            name="bench-comm",
            module="workloads.comm.bench",
            help="time each collective over message sizes (for `project`)",
        ),
        Command(
            name="report",
            module="analysis.cli.report",
            help="write the HTML report from run folders",
            torch_free=True,
        ),
        Command(
            name="runs",
            module=ANALYSIS_MAIN,
            help="compare run folders (speedup, memory, accuracy, comm)",
            torch_free=True,
        ),
        Command(
            name="traces",
            module=ANALYSIS_MAIN,
            help="analyse one folder of per-rank Kineto traces",
            torch_free=True,
        ),
        Command(
            name="merge",
            module=ANALYSIS_MAIN,
            help="merge the parts of `traces --shard K/N` into one JSON",
            torch_free=True,
        ),
        Command(
            name="ops",
            module=ANALYSIS_MAIN,
            help="top operators of one run by self time",
            torch_free=True,
        ),
        Command(
            name="diff",
            module=ANALYSIS_MAIN,
            help="what changed between two runs, operator by operator",
            torch_free=True,
        ),
        Command(
            name="flightrec",
            module=ANALYSIS_MAIN,
            help="a failed DDP run's flight-recorder dumps: the collective the ranks disagree on",
            torch_free=True,
        ),
        Command(
            name="project",
            module=ANALYSIS_MAIN,
            help="project step time to more ranks from a run and a bench-comm run",
            torch_free=True,
        ),
        Command(
            name="tensorboard",
            module="workloads.tools.tensorboard",
            help="serve the traces in TensorBoard's profiler plugin (127.0.0.1)",
        ),
        Command(
            name="demo",
            module="workloads.tools.demo",
            help="profile a small workload in every mode, in rounds until the speedup is known, and report",
        ),
    )
}


def _version() -> str:
    try:
        return metadata.version("dpscope")
    except metadata.PackageNotFoundError:  # run from a clone without `pip install -e .`
        return "unknown (not installed: pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: a command name and its arguments (parsed by the command itself)."""
    width = max(map(len, COMMANDS))
    listing = "\n".join(f"  {c.name:<{width}}  {c.help}" for c in COMMANDS.values())
    parser = OneLineParser(
        prog="dpscope",
        description="Profile the same PyTorch training as single-device, DataParallel and DDP, "
        "and compare them in one report.",
        epilog=f"commands:\n{listing}\n\n`dpscope COMMAND --help` shows a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dpscope {_version()}")
    parser.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help="see below")
    parser.add_argument(
        "args", nargs=argparse.REMAINDER, metavar="...", help="the command's own arguments"
    )
    return parser


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser `dpscope NAME` uses, with its `dpscope NAME` prog (for docs/reference/cli.md)."""
    command = COMMANDS[name]
    module = importlib.import_module(command.module)
    if command.module != ANALYSIS_MAIN:
        return module.build_parser(f"dpscope {name}")
    subparsers = next(
        a
        for a in module.build_parser("dpscope")._actions
        if isinstance(a, argparse._SubParsersAction)
    )
    return subparsers.choices[name]


def main(argv: list[str] | None = None) -> int:
    """`dpscope COMMAND [ARGS...]`: run one subcommand; return its exit code."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv:  # the command list, not argparse's "arguments are required"
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    command = COMMANDS[args.command]
    run = import_main(command.module, f"dpscope {command.name}")
    if command.module == ANALYSIS_MAIN:
        return run([command.name, *args.args], prog="dpscope")
    return run(args.args, prog=f"dpscope {command.name}")


if __name__ == "__main__":
    sys.exit(main())
