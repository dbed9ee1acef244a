"""`python -m analysis traces DIR`, `runs RUNS_DIR...`, `ops RUN`, `diff RUN_A RUN_B`,
`flightrec RUN`: tables and JSON.

`traces DIR --shard K/N --json PART` and `merge PART... --json OUT` split the traces analysis
over many jobs (analysis/trace/shard.py).

Bad input never shows a traceback: InputError becomes one `<prog> <command>: error: ...` line
on stderr and exit code 2 (profiler.runfolder.errors.run_command); per-file problems are printed as one line each while the good files are still analysed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from analysis.cli import flightrec as frcli  # `flightrec`
from analysis.cli import ops as opscli  # `ops` and `diff`
from analysis.cli import traces as tracescli  # `traces` and `merge`
from analysis.cli.project import add_parser, print_projection
from analysis.cli.project import run as run_projection
from analysis.cli.table import say, table
from analysis.columns import (
    CLI_COLLECTIVE_COLS,
    CLI_FAMILY_COLS,
    CLI_GROUP_COLS,
    CLI_RANK_COLS,
    CLI_RUN_COLS,
    CLI_STRAGGLER_COLS,
    Column,
    fmt,
)
from analysis.jsonsafe import OWN_LINE_CHARS, clip, finite_json
from analysis.outputs import check_json_out
from analysis.runs.compare import compare_runs, find_run_dirs
from analysis.runs.family import budget_bytes
from analysis.runs.quiet import add_quiet_argument
from analysis.trace.clocks import add_clock_align
from profiler.runfolder.atomic import write_json_atomic
from profiler.runfolder.errors import InputError, OneLineParser, run_command
from profiler.runfolder.layout import STEP_PHASES

__all__ = ["main"]


def _write_json(result: dict, out: Path | None) -> None:
    """Write the JSON atomically (a reader never sees half a file); an unwritable OUT is one
    InputError line, never a traceback."""
    if out is None:
        return
    # The results are already finite (finite_json); this keeps a later change from writing NaN.
    finite_json(result, result.setdefault("warnings", []))
    try:
        write_json_atomic(out, result)
    except OSError as err:
        raise InputError(
            out, f"cannot write the JSON ({err.strerror})", "pass a writable file path to --json"
        ) from None


def print_traces(result: dict) -> None:
    """Per-rank, per-collective and straggler tables of a traces JSON."""
    say(f"traces: {result['trace_dir']}  kind={result['kind']}  world_size={result['world_size']}")
    rows = [{**r, **{f"tb_{k}": v for k, v in r["tb_split"].items()}} for r in result["ranks"]]
    say(table(rows, CLI_RANK_COLS))
    if result["collectives"]:
        say("\ncollectives (per rank, mean over ranks; MB = 10⁶ bytes, GB = 10⁹ bytes)")
        say(table(result["collectives"], CLI_COLLECTIVE_COLS))
    if len(result["stragglers"]) > 1:
        say("\nstragglers (start skew of matching collectives vs the earliest rank)")
        say(table(result["stragglers"], CLI_STRAGGLER_COLS))
        spread = result["step_time_spread"]
        if spread:
            us = Column(key="us", label="", kind="num", digits=1)
            say(
                f"step-time spread: min {fmt(spread['min_us'], us)} µs, max "
                f"{fmt(spread['max_us'], us)} µs, spread {fmt(spread['spread_pct'], us)} %"
            )
    for warning in result.get("warnings", []):
        say(f"warning: {warning}")
    _print_skipped(result["skipped"], "file")


def _print_skipped(skipped: list[dict], key: str) -> None:
    if skipped:
        say(f"\nskipped {len(skipped)}:")
        for s in skipped:
            say(f"  {s[key]}: {s['reason']}")


def print_runs(result: dict) -> None:
    """Run and group tables of a runs JSON."""
    ms = Column(key="ms", label="", kind="num", digits=1)
    rows = [
        {
            **r,
            "phases_ms": "/".join(fmt(r["phases_s"][p] * 1e3, ms) for p in STEP_PHASES)
            if r["phases_s"]
            else None,
        }
        for r in result["runs"]
    ]
    say(table(rows, CLI_RUN_COLS))
    for run in result["runs"]:
        if run["error"]:
            kind = run["error"].get("kind")
            status = f"{run['status']} ({str(kind).replace('_', ' ')})" if kind else run["status"]
            say(f"  {clip(run['run_id'])}: {status}: {clip(run['error'].get('message'))}")
        for warning in run["warnings"]:
            say(f"  warning: {clip(warning)}")
    for warning in result.get("warnings", []):
        say(f"warning: {warning}")
    if result.get("invalid"):
        say(f"\ninvalid {len(result['invalid'])}:")
        for bad in result["invalid"]:
            say(f"  {clip(bad['reason'], OWN_LINE_CHARS)}")
    if result["groups"]:
        say("\ngroups (mean ± sample std over seeds)")
        say(table(result["groups"], CLI_GROUP_COLS))
    for f in result.get("family") or []:
        say(f"\nfamily: {f['model']}, {f['backend']}, {f['world_size']} ranks (vs DDP)")
        say(table([f["ddp"], *f["members"]], CLI_FAMILY_COLS))
    for tune in result.get("tunes", []):  # make tune-ddp folders: their verdict, not their trials
        best = tune["best"]
        verdict = f"best {best['name']}" if best else "no knob beat the run-to-run noise"
        say(f"\ntune {tune['tune_id']} ({tune['status']}): {verdict}\n  {tune['command']}")
    _print_skipped(result["skipped"], "path")


def build_parser(prog: str = "python -m analysis") -> argparse.ArgumentParser:
    p = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("runs", help="compare run folders (speedup, memory, accuracy, comm)")
    r.add_argument("runs_dirs", type=Path, nargs="+", metavar="RUNS_DIR")
    r.add_argument("--no-traces", action="store_true", help="skip trace analysis")
    r.add_argument(
        "--memory-budget-gib",
        type=float,
        default=None,
        help="per-rank memory the largest-model-that-fits estimate uses (default: the device's "
        "memory; CPU: the host's RAM ÷ ranks per node)",
    )
    add_quiet_argument(r)
    traces_parsers = tracescli.add_parsers(sub)
    for s in (*traces_parsers, r):
        add_clock_align(s)
    for s in (*traces_parsers, r, *opscli.add_parsers(sub), add_parser(sub), frcli.add_parser(sub)):
        s.add_argument("--json", type=Path, default=None, metavar="OUT", help="write JSON here")
        s.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _check_out(args: argparse.Namespace) -> None:
    """Refuse a bad --json before any work: empty, a folder, an input or inside an input."""
    if args.command in ("traces", "merge"):
        tracescli.check_outputs(args)
    elif args.json is None:
        return
    else:  # runs, ops, diff, project: never inside one of the run folders read
        names = ("runs_dirs", "run", "run_a", "run_b", "comm", "measured", "batch_runs")
        inputs = [p for n in names for p in _as_list(getattr(args, n, None))]
        check_json_out(args.json, [], find_run_dirs(inputs)[0])


def _as_list(value: Any) -> list:
    return [] if value is None else value if isinstance(value, list) else [value]


def main(argv: list[str] | None = None, *, prog: str = "python -m analysis") -> int:
    """Run one subcommand; `prog` names the command in help and errors (`dpscope` passes its own)."""
    args = build_parser(prog).parse_args(argv)
    # Ctrl-C: one line; --json is written atomically, so nothing is left half-written.
    return run_command(
        f"{prog} {args.command}", lambda: _run(args), interrupted="nothing half-written was left"
    )


def _run(args: argparse.Namespace) -> int:
    progress = not args.no_progress
    _check_out(args)
    if args.command == "traces" and args.shard is not None:
        return tracescli.run_shard(args, progress, _write_json)
    if args.command == "project":
        result, show = run_projection(args), print_projection
    elif args.command == "flightrec":
        result, show = frcli.run_flightrec(args.run), frcli.print_flightrec
    elif args.command == "traces":
        result, show = tracescli.run_traces(args, progress), print_traces
    elif args.command == "merge":
        result, show = tracescli.run_merge(args), print_traces
    elif args.command == "runs":
        result = compare_runs(
            args.runs_dirs,
            progress=progress,
            traces=not args.no_traces,
            clock_align=args.clock_align,
            memory_budget_bytes=budget_bytes(args.memory_budget_gib),
            quiet_frac=args.quiet_frac,
        )
        show = print_runs
    else:
        result, show = opscli.run(args)
    _write_json(result, args.json)  # before the tables: a closed pipe must not lose it
    if args.command in ("traces", "merge"):
        tracescli.write_parquet(result, args.parquet)
    show(result)
    if args.json is not None:
        say(f"wrote {args.json}")
    if args.command == "runs" and not result["runs"] and not result.get("tunes"):
        # every folder was invalid: nothing usable
        where = ", ".join(map(str, args.runs_dirs))
        raise InputError(
            where, "no run could be analysed", "fix or remove the invalid run folders listed"
        )
    return 0
