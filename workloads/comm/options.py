"""The command line of `make bench-comm` (workloads.comm.bench): its parser, and the parsing of
message sizes, collectives and gaps shared by the launching side and every rank (one-line
LaunchError each)."""

from __future__ import annotations

import argparse

from profiler.runfolder.errors import OneLineParser
from workloads.comm.ops import COLLECTIVES
from workloads.launch.launcher import LaunchError

__all__ = [
    "DEFAULT_GAPS_MS",
    "MAX_MESSAGE_BYTES",
    "build_parser",
    "check_bytes",
    "default_sizes",
    "parse_collectives",
    "parse_gaps",
    "parse_sizes",
]

DESCRIPTION = "`make bench-comm`: an nccl-tests-like collective benchmark as a torchrun job."


def default_sizes(max_bytes: int) -> list[int]:
    """Powers of 2 from 4 B (one float32) to `max_bytes`."""
    sizes, s = [], 4
    while s <= max_bytes:
        sizes.append(s)
        s *= 2
    return sizes


MAX_MESSAGE_BYTES = 1 << 36
"""The largest message size (64 GiB: above any one GPU's buffer; each rank allocates it twice)."""


def check_bytes(flag: str, value: int, *, allow_zero: bool = False) -> int:
    """A message size for `flag`: 4 B (one float32) to MAX_MESSAGE_BYTES (0 = the default when
    `allow_zero`); one LaunchError line otherwise, before any rank starts."""
    if allow_zero and value == 0:
        return value
    if not 4 <= value <= MAX_MESSAGE_BYTES:
        raise LaunchError(
            f"{flag} must be a byte count from 4 (one float32) to {MAX_MESSAGE_BYTES:,} "
            f"(64 GiB){' or 0 for the default' if allow_zero else ''}; got {value}"
        )
    return value


DEFAULT_GAPS_MS = (0.0, 1.0, 3.0, 10.0, 30.0, 100.0)
"""The compute gaps (ms) the idle-penalty sweep times each collective after (`--gaps-ms`)."""


def parse_gaps(text: str) -> tuple[float, ...]:
    """`--gaps-ms`: milliseconds of compute, e.g. '0 1 3 10 30 100' (sorted, duplicates dropped);
    '' = DEFAULT_GAPS_MS, 'none' = no sweep (back-to-back timing only)."""
    text = str(text).strip()
    if not text:
        return DEFAULT_GAPS_MS
    if text.lower() == "none":
        return ()
    try:
        gaps = sorted({float(t) for t in text.replace(",", " ").split()})
    except ValueError:
        gaps = [-1.0]
    if not all(0 <= g <= 10_000 for g in gaps):
        raise LaunchError(
            "--gaps-ms must be milliseconds from 0 to 10000 like '0 1 3 10 30 100' "
            f"(or 'none'); got {text!r}"
        )
    return tuple(gaps)


def parse_collectives(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(t for t in text.replace(",", " ").split())) or COLLECTIVES
    unknown = [t for t in names if t not in COLLECTIVES]
    if unknown:
        raise LaunchError(
            f"--collectives must name some of {', '.join(COLLECTIVES)}; got {', '.join(unknown)}"
        )
    return names


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(t) for t in text.replace(",", " ").split()})
    except ValueError:
        raise LaunchError(
            f"--sizes must be byte counts like '1024 1048576'; got {text!r}"
        ) from None
    if not sizes:
        raise LaunchError(f"--sizes must be byte counts like '1024 1048576'; got {text!r}")
    for size in (sizes[0], sizes[-1]):
        check_bytes("--sizes", size)
    return sizes


def build_parser(prog: str = "python -m workloads.comm.bench") -> argparse.ArgumentParser:
    p = OneLineParser(prog=prog, description=DESCRIPTION)
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    p.add_argument("--nproc", type=int, default=None, help="ranks (default as profile-ddp)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--run-id", default="", help="default: comm-<backend>-n<world>-<time>")
    p.add_argument("--sizes", default="", help="explicit byte sizes, e.g. '1024 1048576'")
    p.add_argument(
        "--max-bytes",
        type=int,
        default=0,
        help="largest power-of-2 size (default 64 MiB GPU, 16 MiB CPU)",
    )
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per size")
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads per rank (0 = cores ÷ ranks)"
    )
    p.add_argument(
        "--collectives", default="", help=f"some of: {' '.join(COLLECTIVES)} (default: all)"
    )
    p.add_argument(
        "--gaps-ms",
        default="",
        help="idle-penalty sweep: all_reduce and broadcast timed after each of these ms of "
        "compute, as in training (default '0 1 3 10 30 100'; 'none' to skip)",
    )
    p.add_argument(
        "--gap-iters", type=int, default=5, help="timed iterations per size and gap (sweep)"
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p
