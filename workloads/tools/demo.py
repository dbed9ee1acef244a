"""`dpscope demo` (what `make demo` runs): profile a small workload in every mode this machine
supports as interleaved rounds until the speedup is known (`--repeat auto`: single, DDP, single,
DDP, ... until the speedup's 95% CI over rounds is within ±5%, 3 to 5 rounds; the report shows the
median and that interval), then write the report.

`--modes` (make: MODES) picks the family: single, dp and ddp come from one `--mode all` launch
per seed; zero1 (DDP with `--zero 1`) and fsdp (FSDP2) are a launch each per seed, on DDP's
backend and ranks, so the report shows DDP, ZeRO-1 and FSDP2 side by side (default: single dp
ddp fsdp). Besides those runs it makes the two inputs that fill the rest of the report:
- one 1-rank DDP run (first seed), from which "where the efficiency went" takes DDP's own
  per-step cost;
- a short comm benchmark (allreduce and broadcast up to 4 MiB, with FSDP2 or ZeRO-1 also
  all_gather and reduce_scatter, 10 timed calls per size, idle penalty after 0, 3 and 30 ms of
  compute), which gives the report its Projection section.
Any other option is a `dpscope profile` option, checked before anything runs, and wins over the
demo's defaults: `dpscope demo --model resnet18 --max-steps 50`. The measured time of the
defaults is in the README.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from profiler.runfolder.errors import OneLineParser, UserError, run_command

__all__ = ["DEMO_DEFAULTS", "build_parser", "main", "parse_modes"]

# Launcher options the demo sets unless the user passes their own (a later option wins).
DEMO_DEFAULTS = ("--mode", "all", "--model", "smallcnn", "--max-steps", "24", "--repeat", "auto")
# The comm benchmark's options: small sizes, few calls and three compute gaps for the idle
# penalty (the full sweep's six take 23 s alone) keep it to about 20 s on 2 CPU cores.
DEMO_COMM = (
    "--iters", "10", "--warmup", "3", "--max-bytes", str(4 * 1024 * 1024), "--gaps-ms", "0 3 30",
)  # fmt: skip
DEMO_MODES = "single dp ddp fsdp"
# What each mode beyond `--mode all` launches, and the collectives its projection needs.
FAMILY = {
    "zero1": (("--mode", "ddp", "--zero", "1"), ()),
    "fsdp": (("--mode", "fsdp"), ("all_gather_into_tensor", "reduce_scatter_tensor")),
}
BASE_MODES = ("single", "dp", "ddp")


class DemoError(UserError):
    """A bad demo argument; one line that says what to do."""


def build_parser(prog: str = "python -m workloads.tools.demo") -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Profile smallcnn (24 steps) in every mode this machine supports as "
        "interleaved rounds until the speedup is known (--repeat auto), one 1-rank DDP run and a "
        "short comm benchmark, then write the report. Other options are `dpscope profile` "
        "options and win over these defaults (e.g. --model resnet18 --max-steps 50, --repeat 3).",
    )
    parser.add_argument(
        "--seeds", default="0", help='seeds, one set of rounds per mode each (e.g. "0 1")'
    )
    parser.add_argument(
        "--modes",
        default=DEMO_MODES,
        help="the family to run: some of single dp ddp zero1 fsdp (single, dp and ddp are one "
        "--mode all launch; zero1 = ddp --zero 1; fsdp = FSDP2)",
    )
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"), help="folder of run folders")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="report folder")
    parser.add_argument(
        "--no-ddp1",
        dest="ddp1",
        action="store_false",
        help="skip the 1-rank DDP run (the report then folds DDP's own cost into contention)",
    )
    parser.add_argument(
        "--no-comm-bench",
        dest="comm_bench",
        action="store_false",
        help="skip the comm benchmark (the report then has no Projection section)",
    )
    return parser


def parse_modes(text: str) -> list[str]:
    words = text.replace(",", " ").split()
    bad = [w for w in words if w not in (*BASE_MODES, *FAMILY)]
    if not words or bad:
        raise DemoError(
            f'--modes {text!r}: choose from {" ".join((*BASE_MODES, *FAMILY))}, e.g. "{DEMO_MODES}"'
        )
    return words


def _seeds(text: str) -> list[str]:
    words = text.split()
    if not words or not all(w.isdigit() for w in words):
        raise DemoError(f'--seeds {text!r}: give seeds as non-negative integers, e.g. "0 1"')
    return words


def _demo(args: argparse.Namespace, extra: list[str], prog: str) -> int:
    from analysis.cli import report
    from workloads.comm import bench
    from workloads.launch import launcher

    seeds = _seeds(args.seeds)
    modes = parse_modes(args.modes)
    chosen, unknown = launcher.build_parser().parse_known_args([*DEMO_DEFAULTS, *extra])
    if unknown:
        raise DemoError(
            f"unknown option(s) {' '.join(unknown)}; see `dpscope profile --help` for the options "
            "the demo passes on"
        )
    runs = ["--runs-dir", str(args.runs_dir)]
    # Later options win: each launch appends its own seed (and the 1-rank run its mode and size).
    base = chosen.mode != "all" or any(m in modes for m in BASE_MODES)
    launches = [["--seed", seed] for seed in seeds] if base else []
    if chosen.mode == "all":  # the sharded members beside them, on DDP's backend and ranks
        launches += [[*FAMILY[m][0], "--seed", s] for s in seeds for m in FAMILY if m in modes]
    if chosen.mode in ("all", "ddp") and args.ddp1:
        launches.append(["--mode", "ddp", "--nproc", "1", "--seed", seeds[0], "--repeat", "1"])
    for own in launches:
        argv = [*DEMO_DEFAULTS, *extra, *own, *runs]
        if (code := launcher.main(argv, prog=prog)) != 0:
            return code
    if chosen.mode in ("all", "ddp") and args.comm_bench:
        nproc = ["--nproc", str(chosen.nproc)] if chosen.nproc else []
        wanted = [
            "all_reduce",
            "broadcast",
            *(c for m in modes for c in FAMILY.get(m, ("", ()))[1]),
        ]
        comm = [*DEMO_COMM, "--collectives", " ".join(dict.fromkeys(wanted)), *nproc]
        comm += ["--backend", chosen.backend, *runs]
        if (code := bench.main(comm, prog=prog)) != 0:
            return code
    return report.main([str(args.runs_dir), "--out", str(args.out)], prog=prog)


def main(argv: list[str] | None = None, *, prog: str = "python -m workloads.tools.demo") -> int:
    args, extra = build_parser(prog).parse_known_args(argv)
    return run_command(prog, lambda: _demo(args, extra, prog))


if __name__ == "__main__":
    import sys

    sys.exit(main())
