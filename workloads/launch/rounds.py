"""`--repeat N|auto`: the launcher's modes run as interleaved rounds (single, DDP, single, DDP, ...)
until the speedup is known (profiler.runfolder.rounds has the rule and the interval).

Every round is one pass over the modes, each run with its own folder (`<run id>-r<k>`) and
`config.repeat_id` / `config.repeat_round` set, so the analysis pairs each DDP run with its own
round's single run and reports the median speedup with its 95% bootstrap interval over rounds.
After each round the launcher reads the round's finished run folders (their headline throughput:
the quiet-step figure when at least 8 steps were quiet, profiler.runfolder.quiet) and prints the
speedups so far; `--repeat auto` stops when every parallel mode's interval is within ±5%, or at
5 rounds, or when another round would end past `--repeat-budget-s`. A mode this machine can't run
is recorded as skipped once, in the first round. A failed or interrupted run ends the rounds.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from profiler.runfolder.errors import InputError, UserError
from profiler.runfolder.rounds import bootstrap_ci, repeat_done

__all__ = [
    "ModeResult",
    "add_repeat_arguments",
    "check_repeat",
    "repeat_count",
    "repeat_id",
    "run_rounds",
]


@dataclass(frozen=True)
class ModeResult:
    """What one mode of a round ended as."""

    label: str
    """`single`, `dp`, `ddp-gloo`, ...: the mode (and DDP backend) the speedups are named by."""
    status: str
    run_dir: Path | None
    """The run folder of a run that started (None for a skipped mode)."""


def add_repeat_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--repeat",
        default="1",
        help="run the modes as this many interleaved rounds (single, DDP, single, DDP, ...), or "
        "`auto`: until the speedup's 95%% CI over rounds is within ±5%% (at least 3, at most 5 "
        "rounds, or --repeat-budget-s); auto needs --mode all",
    )
    parser.add_argument(
        "--repeat-budget-s",
        type=float,
        default=None,
        help="with --repeat: start no round that would likely end past this many seconds "
        "(replaces auto's 5-round bound)",
    )


def repeat_count(text: str) -> int | None:
    """`--repeat` as a round count, None for `auto`; ValueError naming the flag otherwise."""
    if text == "auto":
        return None
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"--repeat must be `auto` or a whole number >= 1; got {text!r}")
    return count


def check_repeat(args: argparse.Namespace) -> None:
    """The `--repeat` options that are wrong on any machine: one line each (ValueError)."""
    count = repeat_count(args.repeat)
    if args.repeat_budget_s is not None and not args.repeat_budget_s > 0:
        raise ValueError(f"--repeat-budget-s must be > 0 s; got {args.repeat_budget_s}")
    if _one_round_only(args):
        return
    if count is None and args.mode != "all":
        raise ValueError(
            "--repeat auto measures the speedup, so it needs --mode all (or give --repeat N)"
        )
    if args.run_id:
        raise ValueError("--run-id names one run but --repeat makes one per round; leave it out")
    if args.nnodes > 1:
        raise ValueError("--repeat runs on one node; leave out --nnodes or --repeat")


def _one_round_only(args: argparse.Namespace) -> bool:
    return repeat_count(args.repeat) == 1 and args.repeat_budget_s is None


def repeat_id(args: argparse.Namespace) -> str:
    """The id of this command's rounds, `repeat-<YYYYmmddTHHMMSS>` (UTC); "" for one round."""
    if _one_round_only(args):
        return ""
    return "repeat-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S")


def _headline(run_dir: Path | None) -> float | None:
    # Imported here: it needs pandas (a quarter of a second), and only rounds read headlines.
    from profiler.runfolder.quiet import run_headline

    try:
        return run_headline(run_dir) if run_dir is not None else None
    except (InputError, UserError, OSError):
        return None


def _round_speedups(results: list[ModeResult]) -> dict[str, float]:
    """Each parallel mode's speedup in one round: its headline samples/s ÷ the single run's."""
    single = next((_headline(r.run_dir) for r in results if r.label == "single"), None)
    out = {}
    for r in results:
        if r.label != "single" and r.status == "ok" and single:
            if (mine := _headline(r.run_dir)) is not None:
                out[r.label] = mine / single
    return out


def run_rounds(args: argparse.Namespace, one_round: Callable[[int], list[ModeResult]]) -> list[str]:
    """Run `one_round(k)` for k = 0, 1, ... until the rule of `--repeat` stops; the statuses of
    every run. Without `--repeat` (1, no budget) it is one round, as before rounds existed."""
    count = repeat_count(args.repeat)
    if _one_round_only(args):
        return [r.status for r in one_round(0)]
    start, statuses = time.monotonic(), []
    speedups: dict[str, list[float]] = {}
    for k in range(10_000):  # the rule below always stops first; the range only bounds a bug
        results = one_round(k)
        statuses += [r.status for r in results]
        if {"interrupted", "failed"} & set(statuses):
            print(f"\nrounds: stopped after round {k + 1}: a run did not finish ok")
            break
        for label, value in _round_speedups(results).items():
            speedups.setdefault(label, []).append(value)
        _print_round(k, speedups)
        reason = repeat_done(
            speedups,
            rounds=k + 1,
            repeat=count,
            elapsed_s=time.monotonic() - start,
            budget_s=args.repeat_budget_s,
        )
        if reason:
            print(f"rounds: stopped after {k + 1} round(s): {reason}")
            break
    return statuses


def _print_round(k: int, speedups: dict[str, list[float]]) -> None:
    parts = []
    for label, values in speedups.items():
        ci = bootstrap_ci(values)
        if ci is not None:
            n = f"{len(values)} round" + ("s" if len(values) > 1 else "")
            parts.append(f"{label} {ci[0]:.2f}× (95% CI {ci[1]:.2f}–{ci[2]:.2f}, {n})")
    print(f"\nround {k + 1}: speedup " + ("; ".join(parts) if parts else "not measured"))
