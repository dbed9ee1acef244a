"""Tables for `python -m analysis ops` and `python -m analysis diff` (the JSON is the result)."""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis.cli import _fmt, _table

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
    from analysis.opsdiff import diff_runs, run_ops

    if args.command == "ops":
        return run_ops(args.run, top=args.top), print_ops
    result = diff_runs(args.run_a, args.run_b, rank=args.rank)
    return result, lambda r: print_diff(r, top=args.top)


def print_ops(result: dict) -> None:
    print(f"operators: {result['run_id']}  kind={result['kind']}  (per analysed step)")
    for r in result["ranks"]:
        t = r["self_us_per_step"]
        print(
            f"\nrank {r['rank']}: {r['steps']} steps, step {_fmt(r['step_time_us_mean'])} µs; "
            f"self µs/step by timeline: training thread {_fmt(t['training_thread'])},"
            f" other threads {_fmt(t['other_threads'])}, GPU {_fmt(t['gpu'])}"
        )
        print(
            _table(
                r["ops"],
                {
                    "name": "operator",
                    "kind": "kind",
                    "calls_per_step": "calls/step",
                    "self_us_per_step": "self µs/step",
                    "total_us_per_step": "total µs/step",
                    "pct_of_step": "% of step",
                },
            )
        )
    for w in result["warnings"]:
        print(f"warning: {w}")


def print_diff(result: dict, *, top: int = 30) -> None:
    a, b = result["a"], result["b"]
    print(
        f"diff: B = {b['run_id']} (rank {b['rank']}) vs A = {a['run_id']} (rank {a['rank']}),"
        " per analysed step"
    )
    st = result["step_time_us"]
    print(f"step µs: A {_fmt(st['a'])}, B {_fmt(st['b'])}, delta {_fmt(st['delta'])}")
    cols = {
        "name": "operator",
        "status": "status",
        "calls_per_step_a": "calls/step A",
        "calls_per_step_b": "calls/step B",
        "self_us_per_step_a": "self µs/step A",
        "self_us_per_step_b": "self µs/step B",
        "delta_us_per_step": "delta µs/step",
        "delta_pct": "delta %",
    }
    if result["per_sample"]:
        cols["delta_us_per_sample"] = "delta µs/sample"
    print(f"\noperators (top {top} by |delta|)")
    print(_table(result["ops"][:top], cols))
    if result["phases"]:
        print("\nphases (steps.csv, ms per step)")
        rows = [
            {**p, **{k: p[k] * 1e3 for k in ("a_s", "b_s", "delta_s")}} for p in result["phases"]
        ]
        print(
            _table(
                rows,
                {"phase": "phase", "a_s": "A ms", "b_s": "B ms", "delta_s": "delta ms"}
                | {"delta_pct": "delta %"},
                2,
            )
        )
    if result["collectives"]:
        print("\ncollectives (per step)")
        print(
            _table(
                result["collectives"],
                {
                    "name": "collective",
                    "status": "status",
                    "calls_per_step_a": "calls A",
                    "calls_per_step_b": "calls B",
                    "latency_us_per_step_a": "latency µs A",
                    "latency_us_per_step_b": "latency µs B",
                    "delta_us_per_step": "delta µs",
                },
            )
        )
    for w in result["warnings"]:
        print(f"warning: {w}")
