"""`make bench-projection`: how close `analysis project` comes on this machine, in one run.

Measures, in a fresh folder, for one workload (default the MLP; `--model smallcnn` for a step
that is mostly compute):
- a single-device run with `--threads 1` at per-device batch B, without the profiler (every step
  counts); its phases give the compute gap the workload leaves before each collective;
- a gloo comm benchmark over 2 ranks, 1 thread each, of all_reduce and broadcast (what DDP calls),
  256 B – 4 MiB, each call timed after that gap of compute (`bench_comm --gap-ms`): on a CPU host
  a collective issued after compute is slower than a back-to-back one (docs/analysis.md §10);
- a 1-rank gloo DDP run without the profiler (DDP's own per-step cost, no communication);
- a 2-rank gloo DDP run (weak scaling, batch B per rank, 10 profiled steps whose traces give the
  exposed communication the replay takes out of backward).
These four make one round; `--repeats` rounds run one after another, so each round's runs are
minutes apart at most and the machine's drift (other jobs, the host) stays out of the comparison.
Then prints, per round (each with its own comm run) and as the median over rounds:
- weak-scaling error: that round's single-device run projected to 2 ranks vs its DDP run's step;
- the same from the 1-rank DDP run (the difference to the line above is DDP's own overhead);
- replay error: the DDP run projected from itself at its own 2 ranks vs its measured step time.
The gaps come from the first round's single-device run and stay fixed.
Goal ≤ 10% for both (the issue's target). Writes `bench-projection.json` beside the run folders.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[1]
GOAL_PCT = 10.0
SIZES = " ".join(str(256 * 4**k) for k in range(7)) + f" {2 << 20} {4 << 20}"  # 256 B .. 4 MiB


def _run(module: str, args: list[str]) -> None:
    cmd = [sys.executable, "-m", module, *args]
    print(f"\n$ {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:  # its output only when it failed: the summary is what matters here
        print(proc.stdout)
        raise SystemExit(f"bench-projection: {module} failed (exit code {proc.returncode})")


def compute_gaps_ms(run_dir: Path) -> dict[str, float]:
    """Compute (ms) a DDP step of this workload runs between its collectives, from a single-device
    run's measured phases: before the buffer broadcast (start of forward) the optimizer, data and
    loop remainder; before the gradient all-reduce forward + backward, or the whole step when the
    model has no buffers (then the all-reduce is the step's only collective)."""
    steps = pd.read_csv(run_dir / "steps.csv")
    body = steps[steps["warmup"] == 0]
    ph = {p: 1e3 * float(body[f"{p}_s"].mean()) for p in ("forward", "backward")}
    step = 1e3 * float(body["step_time_s"].mean())
    rec = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    buffers = (rec.get("metrics") or {}).get("buffer_bytes_by_dtype") or {}
    if not buffers:
        return {"all_reduce": step}
    fb = ph["forward"] + ph["backward"]
    return {"all_reduce": fb, "broadcast": max(0.0, step - fb)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workloads.bench_projection")
    parser.add_argument("--runs-dir", default="runs/bench-projection")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch", type=int, default=64, help="per-device batch B")
    parser.add_argument("--steps", type=int, default=200, help="steps per training run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved DDP/single rounds")
    parser.add_argument("--iters", type=int, default=30, help="comm bench timed iterations")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.steps < 10:
        parser.error("--repeats must be >= 1 and --steps >= 10")
    root = Path(args.runs_dir) / datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    common = [
        *("--model", args.model, "--dataset", "synthetic", "--device", "cpu"),
        *("--scaling", "weak", "--batch-size", str(args.batch), "--epochs", "1000"),
        *("--max-steps", str(args.steps), "--threads", str(args.threads), "--runs-dir", str(root)),
    ]
    single = ["--mode", "single", "--no-profile", *common]
    # 10 profiled steps: the replay's exposed-comm share rests on them (steps vary a lot on CPU)
    ddp = ["--mode", "ddp", "--backend", "gloo", "--nproc", "2", "--profile-active", "10", *common]
    ddp1 = ["--mode", "ddp", "--backend", "gloo", "--nproc", "1", "--no-profile", *common]
    comm = [
        *("--backend", "gloo", "--nproc", "2", "--threads", str(args.threads)),
        *("--collectives", "all_reduce broadcast", "--sizes", SIZES),
        *("--iters", str(args.iters), "--warmup", "3", "--runs-dir", str(root)),
    ]
    gaps: dict[str, float] = {}
    for i in range(1, args.repeats + 1):
        _run("workloads.launch", [*single, "--run-id", f"single-{i}"])
        gaps = gaps or compute_gaps_ms(root / "single-1")
        spec = ",".join(f"{k}={v:.2f}" for k, v in gaps.items())
        _run("workloads.bench_comm", [*comm, "--gap-ms", spec, "--run-id", f"comm-{i}"])
        _run("workloads.launch", [*ddp1, "--run-id", f"ddp1-{i}"])
        _run("workloads.launch", [*ddp, "--run-id", f"ddp-{i}"])

    from analysis.errors import AnalysisError
    from analysis.project import project

    rounds = []
    try:
        for i in range(1, args.repeats + 1):
            d, c = root / f"ddp-{i}", root / f"comm-{i}"
            r: dict = {"round": i}
            for key, source in (("weak", "single"), ("weak_ddp1", "ddp1")):
                p = project(root / f"{source}-{i}", c, [2], measured=[d], traces=False)
                r[key] = p["measured"][0]
                r[f"{source}_step_time_s"] = p["inputs"]["measured_step_time_s"]
            r["replay"] = project(d, c, [2])["replay"]
            rounds.append(r)
    except AnalysisError as err:
        print(f"bench-projection: error: {err}", file=sys.stderr)
        return 2
    _print(args, root, gaps, rounds)
    summary = {key: _median(rounds, key) for key, _ in ARMS}
    out = {"model": args.model, "batch": args.batch, "gaps_ms": gaps, "rounds": rounds, **summary}
    (root / "bench-projection.json").write_text(json.dumps(out, indent=2, default=float))
    warnings = project(root / "single-1", root / "comm-1", [2])["warnings"]
    for w in dict.fromkeys(warnings):
        print(f"  warning: {w}")
    return 0


ARMS = (
    ("weak", "single device -> 2 DDP ranks (weak scaling)"),
    ("weak_ddp1", "DDP at 1 rank -> 2 ranks (weak scaling)"),
    ("replay", "replay (DDP at n=2 from itself)"),
)


def _median(rounds: list[dict], key: str) -> dict:
    errs = np.array([r[key]["error_pct"] for r in rounds])
    return {"median_error_pct": float(np.median(errs)), "errors_pct": errs.tolist()}


def _print(args: argparse.Namespace, root: Path, gaps: dict, rounds: list[dict]) -> None:
    print(
        f"\nbench-projection ({args.model}, batch {args.batch}/rank, --threads {args.threads}, "
        f"gloo, 2 ranks, {args.repeats} rounds; run folders in {root})"
    )
    print(
        "  compute before each collective: " + ", ".join(f"{k} {v:.1f} ms" for k, v in gaps.items())
    )
    head = f"  {'round':>5} {'single':>9} {'DDP 1':>9} {'DDP 2':>9}"
    print(head + "".join(f" {k + ' proj':>15} {'error':>7}" for k, _ in ARMS) + "   (step times)")
    for r in rounds:
        line = f"  {r['round']:>5}"
        for t in (
            r["single_step_time_s"],
            r["ddp1_step_time_s"],
            r["replay"]["measured_step_time_s"],
        ):
            line += f" {1e3 * t:>6.2f} ms"
        for key, _ in ARMS:
            line += (
                f" {1e3 * r[key]['predicted_step_time_s']:>12.2f} ms {r[key]['error_pct']:>+6.1f}%"
            )
        print(line)
    for key, label in ARMS:
        m = _median(rounds, key)
        errs = m["errors_pct"]
        verdict = "met" if abs(m["median_error_pct"]) <= GOAL_PCT else "missed"
        print(
            f"  {label}: median error {m['median_error_pct']:+.1f}% (rounds {min(errs):+.1f}% "
            f"to {max(errs):+.1f}%; goal ≤ {GOAL_PCT:g}%: {verdict})"
        )


if __name__ == "__main__":
    sys.exit(main())
