"""Scaling sweeps: `make profile-sweep` = `python -m workloads.tools.sweep`.

A sweep is every combination of mode (single, dp, ddp, and the sharded zero1 = DDP with
`--zero 1` and fsdp = FSDP2), backend, world size and seed for one workload. Each combination is one ordinary launcher run (`python -m workloads.launch`) with a
deterministic run id, `<sweep>-<mode>[-<backend>]-n<world>-s<seed>`, and `config.sweep_id` set, so
the report can group the sweep and a re-run knows what is already done:

- a combination whose run folder already ended `ok` is skipped (an interrupted sweep finishes
  with the same command);
- an earlier `skipped` record (a reason, no data) is decided again; any other earlier attempt
  (failed, interrupted, unreadable) is moved to `<runs>/.replaced/` and run again, never deleted;
- a combination this machine can't run (DP without CUDA, NCCL on CPU, more GPUs than present, a
  batch that does not divide) becomes a `status: skipped` run folder with the reason, through the
  launcher's `--skip-impossible`.

DDP at world size 1 is included on purpose: against the single-device run it isolates DDP's own
overhead (the reducer, bucket copies and a one-rank all-reduce). Single-device runs do not depend
on the world size, so there is one per seed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from profiler.runfolder.errors import InputError, OneLineParser, UserError, run_command
from profiler.runfolder.layout import RUN_JSON
from profiler.runfolder.records import read_record
from workloads.launch.child import child_env, user_path

__all__ = ["Combo", "SweepError", "combos", "main", "parse_ints"]

MODES = ("single", "dp", "ddp", "zero1", "fsdp")
DEFAULT_MODES = ("single", "dp", "ddp")
# The launcher options of each sweep mode that runs in a process group (one run per backend).
GROUP_MODES = {"ddp": ("--mode", "ddp"), "zero1": ("--mode", "ddp", "--zero", "1"),
               "fsdp": ("--mode", "fsdp")}  # fmt: skip
BACKENDS = ("nccl", "gloo")
# A sweep name becomes part of folder names: keep it to one portable path component.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class SweepError(UserError):
    """A bad sweep argument; the message is one line that says what to do."""


@dataclass(frozen=True)
class Combo:
    """One run of the sweep."""

    mode: str
    backend: str
    """nccl | gloo for ddp, zero1 and fsdp; `auto` otherwise."""
    nproc: int
    """World size: ranks, DP GPUs, 1 for single."""
    seed: int

    def run_id(self, sweep: str) -> str:
        backend = f"-{self.backend}" if self.mode in GROUP_MODES else ""
        return f"{sweep}-{self.mode}{backend}-n{self.nproc}-s{self.seed}"

    def launcher_args(self, sweep: str) -> list[str]:
        mode = list(GROUP_MODES.get(self.mode, ("--mode", self.mode)))
        args = [*mode, "--seed", str(self.seed), "--run-id", self.run_id(sweep)]
        if self.mode in GROUP_MODES:
            args += ["--backend", self.backend]
        if self.mode != "single":
            args += ["--nproc", str(self.nproc)]
        return [*args, "--sweep-id", sweep, "--skip-impossible"]


def parse_ints(text: str, what: str, *, minimum: int) -> list[int]:
    """`"1 2 4"` or `"1,2,4"` -> [1, 2, 4]; one-line SweepError for anything else."""
    items = text.replace(",", " ").split()
    try:
        values = [int(v) for v in items]
    except ValueError:
        raise SweepError(f'{what} must be whole numbers like "1 2 4 8"; got {text!r}') from None
    if not values:
        raise SweepError(f'{what} is empty; give at least one value, e.g. {what}="1 2"')
    if any(v < minimum for v in values):
        raise SweepError(f"{what} values must be >= {minimum}; got {text!r}")
    return sorted(set(values), key=values.index)


def _words(text: str, what: str, allowed: tuple[str, ...]) -> list[str]:
    items = text.replace(",", " ").split()
    if not items:
        raise SweepError(f"{what} is empty; choose from {' '.join(allowed)}")
    bad = [v for v in items if v not in allowed]
    if bad:
        raise SweepError(f"{what}: unknown {' '.join(bad)}; choose from {' '.join(allowed)}")
    return sorted(set(items), key=items.index)


def default_nprocs() -> list[int]:
    """Powers of two up to the visible GPU count (and that count); 1 and 2 on CPU."""
    import torch  # only here: the rest of the sweep needs no torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        return [1, 2]
    sizes = [1 << i for i in range(gpus.bit_length()) if 1 << i <= gpus]
    return sorted({*sizes, gpus})


def combos(
    modes: list[str], backends: list[str], nprocs: list[int], seeds: list[int]
) -> list[Combo]:
    """Every run of the sweep, interleaved so drift (other jobs, the host warming up) hits every
    mode and world size alike: seed-major (a half-finished sweep already covers whole seeds),
    then world size, then mode (single once per seed, first), e.g. single s0, dp n1 s0,
    ddp n1 s0, dp n2 s0, ddp n2 s0, single s1, ..."""
    out: list[Combo] = []
    for seed in seeds:
        if "single" in modes:
            out.append(Combo("single", "auto", 1, seed))
        for n in nprocs:
            for mode in modes:
                if mode == "dp":
                    out.append(Combo("dp", "auto", n, seed))
                elif mode in GROUP_MODES:
                    out += [Combo(mode, b, n, seed) for b in backends]
    return out


def _status(run_dir: Path) -> str | None:
    """The recorded status of an earlier attempt, `unreadable` for a record the typed reader
    refuses, None if none."""
    record = run_dir / RUN_JSON
    if not record.is_file():
        return "incomplete" if run_dir.exists() else None
    try:
        rec, _ = read_record(record)
    except InputError:
        return "unreadable"
    return rec.status


def _set_aside(run_dir: Path, runs_dir: Path) -> Path:
    """Move an earlier, unfinished attempt out of the report's way (hidden folder), keeping it."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    target = runs_dir / ".replaced" / f"{run_dir.name}-{stamp}"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(run_dir), target)
    return target


def build_parser(prog: str = "python -m workloads.tools.sweep") -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Run one workload over modes x backends x world sizes x seeds (one launcher "
        "run each, status: skipped where this machine can't). Unknown arguments go to "
        "workloads.launch, e.g. --model mlp --max-steps 20 --scaling weak.",
    )
    parser.add_argument(
        "--nprocs",
        default=None,
        help='world sizes, e.g. "1 2 4 8" (default: powers of two up to the GPU count; 1 2 on CPU)',
    )
    parser.add_argument(
        "--modes",
        default=" ".join(DEFAULT_MODES),
        help=f'some of {" ".join(MODES)} (zero1 = ddp with --zero 1, fsdp = FSDP2), e.g. "single '
        'ddp fsdp"',
    )
    parser.add_argument(
        "--backends", default=" ".join(BACKENDS), help='DDP backends, e.g. "nccl gloo"'
    )
    parser.add_argument("--seeds", default="0", help='e.g. "0 1 2"')
    parser.add_argument(
        "--sweep",
        default="",
        help="sweep name (default: sweep-<UTC time>); re-use it to finish an interrupted sweep",
    )
    parser.add_argument("--runs-dir", default="runs", help="folder of run folders")
    return parser


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def _plan(args: argparse.Namespace) -> tuple[str, list[Combo], Path]:
    """The sweep's name, its runs and its (absolute) runs folder; every argument checked."""
    sweep = args.sweep or datetime.now(UTC).strftime("sweep-%Y%m%dT%H%M%S")
    if not SAFE_NAME.match(sweep):
        raise SweepError(
            f"SWEEP={sweep!r} is not a safe folder name; use letters, digits, '.', '_' or '-' "
            "(at most 64, starting with a letter or digit)"
        )
    # Not given: the machine's default; given but empty (`NPROCS=`): an error, not a guess.
    nprocs = (
        default_nprocs() if args.nprocs is None else parse_ints(args.nprocs, "NPROCS", minimum=1)
    )
    todo = combos(
        _words(args.modes, "MODES", MODES),
        _words(args.backends, "BACKENDS", BACKENDS),
        nprocs,
        parse_ints(args.seeds, "SEEDS", minimum=0),
    )
    runs_dir = user_path(args.runs_dir)
    if runs_dir.exists() and not runs_dir.is_dir():
        raise SweepError(f"RUNS={runs_dir} is a file, not a folder; pass a folder for the runs")
    return sweep, todo, runs_dir


def _run_combo(combo: Combo, sweep: str, runs_dir: Path, extra: list[str], log: TextIO) -> str:
    """One combination through the launcher (an earlier attempt set aside); its status."""
    run_id = combo.run_id(sweep)
    run_dir = runs_dir / run_id
    earlier = _status(run_dir)
    if earlier == "ok":
        return "done earlier"
    if earlier == "skipped":  # a reason only, no data: re-decided from scratch
        shutil.rmtree(run_dir)
    elif earlier is not None:
        moved = _set_aside(run_dir, runs_dir)
        tqdm.write(f"  {run_id}: earlier attempt ({earlier}) moved to {moved}")
    cmd = [
        sys.executable,
        "-m",
        "workloads.launch",
        *combo.launcher_args(sweep),
        "--runs-dir",
        str(runs_dir),
        *extra,
    ]
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    start = time.perf_counter()
    proc = subprocess.run(
        cmd,
        env=child_env(PYTHONUNBUFFERED="1"),
        stdout=log,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    log.write(proc.stderr)
    if proc.returncode == 2:  # the launcher refused the arguments: every run would
        raise SweepError(_one_line(proc.stderr))
    status = _status(run_dir) or "failed"
    tqdm.write(f"  {run_id}: {status} ({time.perf_counter() - start:.1f} s)")
    return status


def run_sweep(args: argparse.Namespace, extra: list[str]) -> int:
    """Run the sweep; return the exit code (1 if any run failed, 0 otherwise)."""
    sweep, todo, runs_dir = _plan(args)
    runs_dir.mkdir(parents=True, exist_ok=True)
    log_path = runs_dir / f".{sweep}.log"  # hidden: the report does not take it for a run
    print(f"sweep {sweep}: {len(todo)} runs into {runs_dir} (launcher output: {log_path})")
    counts: dict[str, int] = {}
    with (
        open(log_path, "a", encoding="utf-8") as log,
        tqdm(total=len(todo), desc=f"sweep {sweep}", unit="run", file=sys.stderr) as bar,
    ):
        for combo in todo:
            bar.set_postfix_str(combo.run_id(sweep), refresh=True)
            status = _run_combo(combo, sweep, runs_dir, extra, log)
            counts[status] = counts.get(status, 0) + 1
            bar.update(1)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    print(f"sweep {sweep}: {summary}")
    print(f"next: make report RUNS={runs_dir}   (re-run with SWEEP={sweep} to finish or retry)")
    return 1 if counts.get("failed") else 0


def _check_launcher_args(extra: list[str]) -> None:
    """The arguments passed through to every launcher run, checked once before any run starts."""
    from workloads.launch.launcher import build_parser as launch_parser

    _, unknown = launch_parser().parse_known_args(extra)
    if unknown:
        raise SweepError(
            f"unknown option(s) {' '.join(unknown)}; see `dpscope profile --help` for the options "
            "passed through to each run"
        )


def main(argv: list[str] | None = None, *, prog: str = "python -m workloads.tools.sweep") -> int:
    args, extra = build_parser(prog).parse_known_args(argv)

    def body() -> int:
        _check_launcher_args(extra)
        try:
            return run_sweep(args, extra)
        except KeyboardInterrupt:
            print(f"{prog}: interrupted; re-run with the same SWEEP to finish", file=sys.stderr)
            return 130

    return run_command(prog, body)


if __name__ == "__main__":
    sys.exit(main())
