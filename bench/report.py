"""`make bench-report`: how report build time grows from the 8-run demo to a 100-run sweep.

Two tiny real runs (single and 2-rank gloo DDP, made once by the real launcher) are copied into
two folders shaped like the demo (8 runs: 2 seeds × single, DDP-gloo and two skipped modes) and
like a sweep (100 runs: 2 platforms × 5 seeds × single, DDP gloo/nccl at 2, 4, 8 ranks, and
skipped DP runs). Each report is built `--repeats` times, interleaved, and the medians, the
ratio and the 100-run goal (15 s on the project's 2-core machine) are printed and written as JSON.
The same fan-out makes the folders of the report's scale test.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from workloads.launch.child import child_env, user_path

__all__ = ["make_demo", "make_sweep", "main"]

NO_DP = "--mode dp needs at least one CUDA device (nn.DataParallel is GPU-only)"
NO_NCCL = "--backend nccl needs CUDA GPUs and torch sees none; use --backend gloo (or auto)"
TINY = "--model mlp --dataset synthetic --max-steps 8 --batch-size 64 --device cpu".split()
GOAL_S = 15.0


def _copy(src: Path, runs: Path, rid: str, *, os_name: str, **config) -> Path:
    dst = runs / rid
    shutil.copytree(src, dst)
    rec = json.loads((dst / "run.json").read_text())
    rec["run_id"] = rid
    rec["config"].update(config)
    rec["env"]["os"] = os_name
    (dst / "run.json").write_text(json.dumps(rec))
    return dst


def _skipped(src: Path, runs: Path, rid: str, *, os_name: str, reason: str, **config) -> None:
    dst = _copy(src, runs, rid, os_name=os_name, **config)
    rec = json.loads((dst / "run.json").read_text())
    rec.update(status="skipped", metrics={}, traces=[], eval={"epochs": [], "best": None})
    rec["error"] = {"message": reason, "rank": None, "exit_code": None, "log_tail": []}
    (dst / "run.json").write_text(json.dumps(rec))
    shutil.rmtree(dst / "traces", ignore_errors=True)
    (dst / "steps.csv").unlink(missing_ok=True)


def make_sweep(single: Path, ddp: Path, runs: Path, *, seeds: int, oses: tuple[str, ...]) -> int:
    """Copies shaped like `make profile-sweep NPROCS="2 4 8"` over seeds and platforms."""
    for os_name in oses:
        for s in range(seeds):
            p = f"{os_name.lower()}-s{s}"
            _copy(single, runs, f"{p}-single", os_name=os_name, seed=s, sweep_id="scale")
            for n in (2, 4, 8):
                for backend in ("gloo", "nccl"):
                    _copy(ddp, runs, f"{p}-ddp-{backend}-n{n}", os_name=os_name, seed=s,
                          world_size=n, backend=backend, sweep_id="scale")  # fmt: skip
                _skipped(single, runs, f"{p}-dp-n{n}", os_name=os_name, reason=NO_DP,
                         mode="dp", seed=s, world_size=n, sweep_id="scale")  # fmt: skip
    return len(list(runs.iterdir()))


def make_demo(single: Path, ddp: Path, runs: Path) -> int:
    """The 8 run folders of `make demo` on a CPU machine (2 seeds)."""
    for s in range(2):
        _copy(single, runs, f"single-s{s}", os_name="Linux", seed=s)
        _copy(ddp, runs, f"ddp-gloo-s{s}", os_name="Linux", seed=s)
        _skipped(single, runs, f"dp-s{s}", os_name="Linux", reason=NO_DP, mode="dp", seed=s)
        _skipped(ddp, runs, f"ddp-nccl-s{s}", os_name="Linux", reason=NO_NCCL, backend="nccl",
                 seed=s)  # fmt: skip
    return len(list(runs.iterdir()))


def _source_runs(work: Path) -> tuple[Path, Path]:
    """The two real runs every copy comes from (the real launcher, once)."""
    src = work / "src"
    for mode, extra, rid in (("single", [], "single"), ("ddp", ["--nproc", "2"], "ddp")):
        if not (src / rid / "run.json").is_file():
            subprocess.run(
                [sys.executable, "-m", "workloads.launch", "--mode", mode, *extra,
                 "--run-id", rid, "--runs-dir", str(src), *TINY],
                env=child_env(), check=True, capture_output=True,
            )  # fmt: skip
    return src / "single", src / "ddp"


def _build_seconds(runs: Path, out: Path) -> float:
    # A fresh process per build: nothing cached from the previous build (fonts, imports) helps.
    job = "import sys,time; from analysis.report import build_report as b; t=time.perf_counter(); "
    job += "b([sys.argv[1]], sys.argv[2], progress=False); print(time.perf_counter()-t)"
    proc = subprocess.run([sys.executable, "-c", job, str(runs), str(out)], env=child_env(),
                          check=True, capture_output=True, text=True)  # fmt: skip
    return float(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="builds per folder (interleaved)")
    parser.add_argument("--out", default="reports/bench/report.json", help="JSON result")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1; got {args.repeats}")
    out = user_path(args.out)  # before the work starts in a temp folder
    with tempfile.TemporaryDirectory(prefix="dpscope-bench-report-") as tmp:
        work = Path(tmp)
        single, ddp = _source_runs(work)
        (work / "demo").mkdir()
        (work / "sweep").mkdir()
        make_demo(single, ddp, work / "demo")
        make_sweep(single, ddp, work / "sweep", seeds=5, oses=("Linux", "Windows"))
        times: dict[str, list[float]] = {"demo_8": [], "sweep_100": []}
        for i in range(args.repeats):
            for name, folder in (("demo_8", "demo"), ("sweep_100", "sweep")):
                times[name].append(_build_seconds(work / folder, work / f"out-{name}-{i}"))
        size = (work / "out-sweep_100-0" / "index.html").stat().st_size
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "repeats": args.repeats,
        "build_s": times,
        "build_s_median": med,
        "sweep_over_demo_ratio": med["sweep_100"] / med["demo_8"],
        "sweep_html_bytes": size,
        "goal_sweep_100_s": GOAL_S,
        "goal_met": med["sweep_100"] <= GOAL_S,
    }
    print(f"report build, median of {args.repeats} (interleaved, fresh process each):")
    print(f"  8-run demo:    {med['demo_8']:6.2f} s")
    print(f"  100-run sweep: {med['sweep_100']:6.2f} s   (goal <= {GOAL_S:.0f} s: "
          f"{'met' if result['goal_met'] else 'NOT met'}); page {size / 2**20:.2f} MB")  # fmt: skip
    print(f"  ratio sweep/demo: {result['sweep_over_demo_ratio']:.2f}x for 12.5x the runs")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
