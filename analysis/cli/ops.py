"""Tables for `python -m analysis ops` and `python -m analysis diff` (the JSON is the result)."""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis.cli.table import say, table
from analysis.columns import OPS_COLS, Column, diff_columns, fmt, without
from analysis.runs.opdiff import diff_runs, run_ops

US = Column(key="us", label="", kind="num", digits=1)
# A/B columns of `analysis diff`, in the report's Column spec (headers carry the units).
DIFF_OP_COLS = diff_columns(" A", " B", digits=1)
DIFF_PHASE_COLS = [
    Column(key="phase", label="Phase"),
    Column(key="a_s", label="A", unit="ms/step", kind="num", digits=2, scale=1e3),
    Column(key="b_s", label="B", unit="ms/step", kind="num", digits=2, scale=1e3),
    Column(key="delta_s", label="Δ", unit="ms/step", kind="num", digits=2, scale=1e3),
    Column(key="delta_pct", label="Δ", unit="%", kind="num", digits=2),
]
DIFF_COLLECTIVE_COLS = [
    Column(key="name", label="Collective"),
    Column(key="status", label="Status"),
    Column(key="calls_per_step_a", label="Calls A", unit="per step", kind="num", digits=1),
    Column(key="calls_per_step_b", label="Calls B", unit="per step", kind="num", digits=1),
    Column(key="latency_us_per_step_a", label="Latency A", unit="µs/step", kind="num", digits=1),
    Column(key="latency_us_per_step_b", label="Latency B", unit="µs/step", kind="num", digits=1),
    Column(key="delta_us_per_step", label="Δ latency", unit="µs/step", kind="num", digits=1),
]

__all__ = ["add_parsers", "print_diff", "print_ops", "run"]


def add_parsers(sub: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    o = sub.add_parser("ops", help="top operators per rank by self time per step")
    o.add_argument("run", type=Path, metavar="RUN", help="a run folder (runs/<run_id>)")
    o.add_argument("--top", type=int, default=30, help="operators per rank (default 30)")
    d = sub.add_parser("diff", help="operators, phases and collectives of RUN_B vs RUN_A")
    d.add_argument("run_a", type=Path, metavar="RUN_A")
    d.add_argument("run_b", type=Path, metavar="RUN_B")
    d.add_argument("--rank", type=int, default=0, help="rank compared on both sides (default 0)")
    d.add_argument("--top", type=int, default=30, help="operator rows printed (JSON: all)")
    return [o, d]


def run(args: argparse.Namespace) -> tuple[dict, callable]:
    """(result, printer) for an `ops` or `diff` command."""
    if args.command == "ops":
        return run_ops(args.run, top=args.top), print_ops
    result = diff_runs(args.run_a, args.run_b, rank=args.rank)
    return result, lambda r: print_diff(r, top=args.top)


def print_ops(result: dict) -> None:
    say(f"operators: {result['run_id']}  kind={result['kind']}  (per analysed step)")
    for r in result["ranks"]:
        t = r["self_us_per_step"]
        say(
            f"\nrank {r['rank']}: {r['steps']} steps, step {fmt(r['step_time_us_mean'], US)} µs; "
            f"self µs/step by timeline: training thread {fmt(t['training_thread'], US)},"
            f" other threads {fmt(t['other_threads'], US)}, GPU {fmt(t['gpu'], US)}"
        )
        say(table(r["ops"], OPS_COLS))  # the report's Operators columns
    for w in result["warnings"]:
        say(f"warning: {w}")


def print_diff(result: dict, *, top: int = 30) -> None:
    a, b = result["a"], result["b"]
    say(
        f"diff: B = {b['run_id']} (rank {b['rank']}) vs A = {a['run_id']} (rank {a['rank']}),"
        " per analysed step"
    )
    st = result["step_time_us"]
    say(f"step µs: A {fmt(st['a'], US)}, B {fmt(st['b'], US)}, delta {fmt(st['delta'], US)}")
    cols = DIFF_OP_COLS if result["per_sample"] else without(DIFF_OP_COLS, "delta_us_per_sample")
    say(f"\noperators (top {top} by |delta|)")
    say(table(result["ops"][:top], cols))
    if result["phases"]:
        say("\nphases (steps.csv, per step)")
        say(table(result["phases"], DIFF_PHASE_COLS))
    if result["collectives"]:
        say("\ncollectives (per step)")
        say(table(result["collectives"], DIFF_COLLECTIVE_COLS))
    for w in result["warnings"]:
        say(f"warning: {w}")
