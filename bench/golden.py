"""`make golden`: the committed golden run set, tests/data/golden/ (python -m bench.golden).

Four run folders made by the real launcher (torchrun on gloo, CPU) with tiny settings, so that
the analysis, report and hostile-input tests read real run folders without training:

- `single-mlp`: a profiled single-device MLP run (8 steps, global batch 64, seed 0);
- `ddp-gloo-mlp`: the same workload as a 2-rank gloo DDP run (the same config: the
  single-vs-DDP equivalence holds on the pair);
- `comm-gloo`: a 2-rank gloo `bench-comm` run over a few sizes with a short idle sweep;
- `failed-ddp-mlp`: the DDP run with rank 1 made to crash at step 2 (the DPSCOPE_FAIL_RANK test
  hook): status `failed`, the error record and the launcher's logs.

Each folder is copied in as the launcher wrote it. The only edit is to its text (run.json,
owner.json, logs, and the traces' text inflated and deflated again): the machine's own paths (the
temporary runs folder, this checkout, the Python installation also where a link points to it, the
temporary folder Kineto names its trace after) are replaced by neutral words (`runs`, `dpscope`,
`python`, `tmp`), because the committed set must not carry one machine's paths. No number, field
or event the analysis reads is changed.

tests/test_golden.py regenerates folders of the set into a temporary folder and checks that they
still have the committed files, run.json keys and steps.csv columns: a change of the run-folder
format fails there until `make golden` is run and tests/data/golden/ is committed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from profiler.runfolder.hostload import is_busy
from workloads.launch.child import PACKAGE_ROOT, child_env

__all__ = [
    "GOLDEN",
    "GOLDEN_RUNS",
    "TINY",
    "GoldenRun",
    "GoldenRunError",
    "machine_paths",
    "main",
    "make_run",
    "make_runs",
    "scrub",
]

GOLDEN = PACKAGE_ROOT / "tests" / "data" / "golden"

# The tiny profiled workload of both training runs (launcher arguments). On CPU even where a GPU
# exists, and one thread per rank whatever the core count, so the set is the same on every
# machine (and a single-device run is not slowed 30-fold by a neighbour on a 2-core machine).
TINY = (
    "--model mlp --dataset synthetic --max-steps 8 --batch-size 64 --epochs 1 --seed 0 "
    "--device cpu --threads 1"
).split()
DDP = "--mode ddp --nproc 2 --backend gloo".split()
COMM = "--backend gloo --nproc 2 --iters 3 --warmup 1 --gap-iters 2".split() + [
    "--sizes",
    "4 64 4096 65536",
    "--gaps-ms",
    "0 1",
]


class GoldenRunError(RuntimeError):
    """A golden run ended with another exit code than its own (the message holds its output)."""


@dataclass(frozen=True)
class GoldenRun:
    """One folder of the set: the module run (`python -m MODULE ARGS --run-id NAME --runs-dir
    DIR`), the environment it adds (fault hooks) and the exit code it must end with."""

    name: str
    module: str
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    exit_code: int = 0


GOLDEN_RUNS: dict[str, GoldenRun] = {
    run.name: run
    for run in (
        GoldenRun("single-mlp", "workloads.launch", ("--mode", "single", *TINY)),
        GoldenRun("ddp-gloo-mlp", "workloads.launch", (*DDP, *TINY)),
        GoldenRun("comm-gloo", "workloads.comm.bench", tuple(COMM)),
        GoldenRun(
            "failed-ddp-mlp",
            "workloads.launch",
            (*DDP, *TINY),
            env={"DPSCOPE_FAIL_RANK": "1", "DPSCOPE_FAIL_STEP": "2"},
            exit_code=1,
        ),
    )
}


def make_run(
    run: GoldenRun, runs_dir: Path, *, extra: tuple[str, ...] = (), timeout: float = 600
) -> subprocess.CompletedProcess:
    """Make `run` with the real launcher into `runs_dir / run.name` (with `extra` launcher
    arguments); return the finished process (text output). Raises GoldenRunError with the
    output when it ends with another exit code."""
    cmd = [sys.executable, "-m", run.module, *run.args, *extra]
    cmd += ["--run-id", run.name, "--runs-dir", str(runs_dir)]
    env = child_env(PYTHONUNBUFFERED="1", **run.env)
    for hook in ("DPSCOPE_FAIL_RANK", "DPSCOPE_FAIL_STEP"):  # only the failed run's own hooks
        if hook not in run.env:
            env.pop(hook, None)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != run.exit_code:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise GoldenRunError(
            f"golden run {run.name}: exit code {proc.returncode}, expected {run.exit_code}:\n{tail}"
        )
    return proc


def make_runs(
    runs: dict[str, tuple[str, ...]], runs_dir: Path, *, timeout: float = 600
) -> dict[str, subprocess.CompletedProcess]:
    """make_run for every {name: extra arguments} at once (their start-up mostly waits on one
    core, so two cores finish them sooner together); {name: finished process}. The first
    GoldenRunError is raised once all have ended."""
    with ThreadPoolExecutor(max_workers=len(runs) or 1) as pool:
        futures = {
            name: pool.submit(make_run, GOLDEN_RUNS[name], runs_dir, extra=extra, timeout=timeout)
            for name, extra in runs.items()
        }
    return {name: future.result() for name, future in futures.items()}


def machine_paths(runs_dir: Path) -> list[tuple[str, str]]:
    """(path, neutral word) pairs, longest path first, so a path inside another goes first."""
    pairs = {
        str(runs_dir.resolve()): "runs",
        str(runs_dir): "runs",
        sys.executable: "python",
        str(Path(sys.executable).resolve()): "python",
        str(PACKAGE_ROOT): "dpscope",
        sys.prefix: "python",
        sys.base_prefix: "python",
        # A venv that is a link (to a shared one): torch's log lines name the real folder.
        str(Path(sys.prefix).resolve()): "python",
        str(Path(sys.base_prefix).resolve()): "python",
        str(Path.home()): "home",
        tempfile.gettempdir(): "tmp",  # Kineto's traceName, a temporary file's
    }
    pairs = {path: word for path, word in pairs.items() if len(path) > 1}
    return sorted(pairs.items(), key=lambda item: -len(item[0]))


def scrub(folder: Path, runs_dir: Path) -> None:
    """Replace this machine's paths in the folder's text (run.json, owner.json, logs/, the
    traces' inflated JSON) by neutral words; steps.csv and comm.csv hold none and are left byte
    for byte, as is every file without a machine path."""
    pairs = machine_paths(runs_dir)
    texts = [folder / "run.json", folder / "owner.json", *sorted((folder / "logs").glob("*"))]
    for path in [*texts, *sorted((folder / "traces").glob("*.json.gz"))]:
        if not path.is_file():
            continue
        packed = path.suffix == ".gz"
        data = path.read_bytes()
        text = original = (gzip.decompress(data) if packed else data).decode("utf-8")
        for machine, word in pairs:
            text = text.replace(machine, word)
        if text != original:
            raw = text.encode("utf-8")
            path.write_bytes(gzip.compress(raw, mtime=0) if packed else raw)


def busy_cores(folder: Path) -> float | None:
    """Cores' worth of CPU other processes used while a training run measured its steps, when
    the busy-machine rule (profiler.runfolder.hostload.is_busy) calls the run busy; else None."""
    load = json.loads((folder / "run.json").read_text()).get("env", {}).get("host_load")
    return load["other_cpu_cores_mean"] if is_busy(load) else None


def make_quiet(run: GoldenRun, runs_dir: Path, tries: int) -> Path:
    """make_run, again (up to `tries` times in all) while the busy-machine rule calls the run
    busy: the committed numbers should be a quiet machine's. The last try is kept either way."""
    for attempt in range(1, tries + 1):
        make_run(run, runs_dir)
        folder = runs_dir / run.name
        busy = busy_cores(folder)
        if busy is None:
            return folder
        print(f"golden: {run.name} measured on a busy machine ({busy:.2f} cores used by other "
              f"processes), try {attempt} of {tries}", flush=True)  # fmt: skip
        if attempt < tries:
            shutil.rmtree(folder)
    print(f"golden: {run.name} kept although busy: re-run `make golden` on an idle machine")
    return folder


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.golden",
        description="Remake the golden run set (tests/data/golden/) with the real launcher.",
    )
    parser.add_argument(
        "--only", nargs="+", choices=sorted(GOLDEN_RUNS), help="remake only these folders"
    )
    parser.add_argument("--out", type=Path, default=GOLDEN, help="default: tests/data/golden")
    parser.add_argument(
        "--tries",
        type=int,
        default=5,
        help="runs of a training run at most while the machine is busy (default 5)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    names = args.only or list(GOLDEN_RUNS)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        for name in names:
            print(f"golden: {name} ...", flush=True)
            try:
                folder = make_quiet(GOLDEN_RUNS[name], Path(tmp), max(1, args.tries))
            except GoldenRunError as err:
                print(f"python -m bench.golden: {err}", file=sys.stderr)
                return 1
            scrub(folder, Path(tmp))
            shutil.rmtree(args.out / name, ignore_errors=True)
            shutil.copytree(folder, args.out / name)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"golden: {len(names)} folders in {args.out} ({size / 1e6:.2f} MB in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
