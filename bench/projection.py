"""`make bench-projection`: how close `analysis project` comes on this machine, in one run.

For each workload in `--models` (default: the small CNN, whose step is mostly compute as in real
training, and the MLP, whose 3–4 ms step is mostly per-step overhead and memory traffic), all with
`--threads 1` per rank, weak scaling at per-device batch B, `--repeats` rounds of:
- a single-device run without the profiler (every step counts); the first one's phases give the
  compute the workload runs between its collectives;
- a gloo comm benchmark over 2 ranks of all_reduce and broadcast (what DDP calls), 256 B – 4 MiB,
  each call timed after that much compute (`bench_comm --gap-ms`): on a CPU host a collective
  issued after compute is slower than a back-to-back one (docs/analysis.md §10);
- a 1-rank gloo DDP run without the profiler (DDP's own per-step cost, no communication);
- a 2-rank gloo DDP run (10 profiled steps, whose traces give the exposed communication the
  replay takes out of backward);
- two single-device runs at once (host contention: what sharing this host's caches and memory
  bandwidth costs each rank, with no communication at all; the model leaves it out, since it
  targets one device per rank).
A round's runs are a minute or two apart at most, so the machine's drift (other jobs, the host)
stays out of each comparison. Printed per round and as the median over rounds, each projection
made with that round's comm run:
- single device -> 2 ranks: the single-device run projected to 2 ranks vs the DDP run's step;
- DDP at 1 rank -> 2 ranks: the same from the 1-rank DDP run (what DDP's own cost adds);
- replay: the DDP run projected from itself at its own 2 ranks vs its measured step time.
Goal ≤ 10% (the issue's target). Writes `bench-projection.json` beside the run folders.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from workloads.launch.child import child_env, user_path

__all__ = ["compute_gaps_ms", "main"]

GOAL_PCT = 10.0
SIZES = " ".join(str(256 * 4**k) for k in range(7)) + f" {2 << 20} {4 << 20}"  # 256 B .. 4 MiB
ARMS = (
    ("weak", "single device -> 2 DDP ranks (weak scaling)"),
    ("weak_ddp1", "DDP at 1 rank -> 2 ranks (weak scaling)"),
    ("replay", "replay (DDP at n=2 from itself)"),
)


def _cmd(module: str, args: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", module, *args]
    print(f"$ {' '.join(cmd)}", flush=True)
    return cmd


def _run(*cmds: list[str]) -> None:
    """Run the commands at the same time; their output only when one failed."""
    env = child_env()
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, text=True) for c in cmds]
    outs = [p.communicate()[0] for p in procs]
    for cmd, proc, out in zip(cmds, procs, outs, strict=True):
        if proc.returncode != 0:
            print(out)
            raise SystemExit(f"bench-projection: {cmd[2]} failed (exit code {proc.returncode})")


def compute_gaps_ms(run_dir: Path) -> dict[str, float]:
    """The compute a DDP step of this workload runs before each of its collectives, from a
    single-device run (analysis.project.inputs.collective_gaps_ms, the projection's own rule)."""
    from analysis.project.inputs import collective_gaps_ms
    from analysis.project.projection import load_training

    return collective_gaps_ms(load_training(run_dir, traces=False))


def bench_model(model: str, args: argparse.Namespace, root: Path) -> dict:
    """Every round of one workload; the projections and the host contention per round."""
    from analysis.project.projection import load_training, project

    common = [
        *("--model", model, "--dataset", "synthetic", "--device", "cpu"),
        *("--scaling", "weak", "--batch-size", str(args.batch), "--epochs", "1000"),
        *("--max-steps", str(args.steps), "--threads", str(args.threads), "--runs-dir", str(root)),
    ]
    single = ["--mode", "single", "--no-profile", *common]
    ddp1 = ["--mode", "ddp", "--backend", "gloo", "--nproc", "1", "--no-profile", *common]
    # 10 profiled steps: the replay's exposed-comm share rests on them (steps vary a lot on CPU)
    ddp = ["--mode", "ddp", "--backend", "gloo", "--nproc", "2", "--profile-active", "10", *common]
    comm = [
        *("--backend", "gloo", "--nproc", "2", "--threads", str(args.threads)),
        *("--collectives", "all_reduce broadcast", "--sizes", SIZES),
        *("--iters", str(args.iters), "--warmup", "3", "--runs-dir", str(root)),
    ]
    gaps: dict[str, float] = {}
    rounds, warnings = [], []
    for i in range(1, args.repeats + 1):
        _run(_cmd("workloads.launch", [*single, "--run-id", f"single-{i}"]))
        gaps = gaps or compute_gaps_ms(root / "single-1")
        spec = ",".join(f"{k}={v:.2f}" for k, v in gaps.items())
        _run(_cmd("workloads.comm.bench", [*comm, "--gap-ms", spec, "--run-id", f"comm-{i}"]))
        _run(_cmd("workloads.launch", [*ddp1, "--run-id", f"ddp1-{i}"]))
        _run(_cmd("workloads.launch", [*ddp, "--run-id", f"ddp-{i}"]))
        pair = [_cmd("workloads.launch", [*single, "--run-id", f"pair{k}-{i}"]) for k in "ab"]
        _run(*pair)
        d, c = root / f"ddp-{i}", root / f"comm-{i}"
        r: dict = {"round": i}
        for key, source in (("weak", "single"), ("weak_ddp1", "ddp1")):
            p = project(root / f"{source}-{i}", c, [2], measured=[d], traces=False)
            warnings += p["warnings"] if (i, source) == (1, "single") else []
            r[key] = p["measured"][0]
            r[f"{source}_step_time_s"] = p["inputs"]["measured_step_time_s"]
        r["replay"] = project(d, c, [2])["replay"]
        both = [load_training(root / f"pair{k}-{i}", traces=False).step_time_s for k in "ab"]
        r["contention_pct"] = 100 * (np.mean(both) / r["single_step_time_s"] - 1)
        rounds.append(r)
    out = {"model": model, "batch": args.batch, "gaps_ms": gaps, "rounds": rounds}
    out |= {key: _median(rounds, key) for key, _ in ARMS}
    out["contention_pct_median"] = float(np.median([r["contention_pct"] for r in rounds]))
    out["warnings"] = list(dict.fromkeys(warnings))
    return out


def _median(rounds: list[dict], key: str) -> dict:
    errs = np.array([r[key]["error_pct"] for r in rounds])
    return {"median_error_pct": float(np.median(errs)), "errors_pct": errs.tolist()}


def _print(out: dict, args: argparse.Namespace, root: Path) -> None:
    print(
        f"\n{out['model']}: batch {args.batch}/rank, --threads {args.threads}, gloo, 2 ranks, "
        f"{args.repeats} rounds (run folders in {root})"
    )
    gaps = ", ".join(f"{k} {v:.1f} ms" for k, v in out["gaps_ms"].items())
    print(f"  compute before each collective: {gaps}")
    head = f"  {'round':>5} {'single':>9} {'DDP 1':>9} {'DDP 2':>9} {'2 singles':>10}"
    print(head + "".join(f" {k + ' proj':>15} {'error':>7}" for k, _ in ARMS))
    for r in out["rounds"]:
        line = f"  {r['round']:>5}"
        for t in (r["single_step_time_s"], r["ddp1_step_time_s"]):
            line += f" {1e3 * t:>6.2f} ms"
        line += f" {1e3 * r['replay']['measured_step_time_s']:>6.2f} ms"
        line += f" {r['contention_pct']:>+9.1f}%"
        for key, _ in ARMS:
            line += (
                f" {1e3 * r[key]['predicted_step_time_s']:>12.2f} ms {r[key]['error_pct']:>+6.1f}%"
            )
        print(line)
    for key, label in ARMS:
        m, errs = out[key]["median_error_pct"], out[key]["errors_pct"]
        verdict = "met" if abs(m) <= GOAL_PCT else "missed"
        print(
            f"  {label}: median error {m:+.1f}% (rounds {min(errs):+.1f}% to {max(errs):+.1f}%; "
            f"goal ≤ {GOAL_PCT:g}%: {verdict})"
        )
    print(
        f"  host contention (not modelled): each of 2 single-device runs at once took "
        f"{out['contention_pct_median']:+.1f}% longer per step than one alone (median)"
    )
    for w in out["warnings"]:
        print(f"  warning: {w}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.projection")
    parser.add_argument("--runs-dir", default="runs/bench-projection")
    parser.add_argument("--models", default="smallcnn,mlp", help="comma-separated workloads")
    parser.add_argument("--batch", type=int, default=64, help="per-device batch B")
    parser.add_argument("--steps", type=int, default=100, help="steps per training run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="rounds per workload")
    parser.add_argument("--iters", type=int, default=30, help="comm bench timed iterations")
    args = parser.parse_args(argv)
    models = [m for m in args.models.replace(",", " ").split()]
    if args.repeats < 1 or args.steps < 20 or not models:
        parser.error("--repeats must be >= 1, --steps >= 20, --models not empty")
    from analysis.errors import AnalysisError

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    results = []
    for model in models:
        root = user_path(args.runs_dir) / stamp / model
        try:
            out = bench_model(model, args, root)
        except AnalysisError as err:
            print(f"bench-projection: error: {err}", file=sys.stderr)
            return 2
        (root / "bench-projection.json").write_text(json.dumps(out, indent=2, default=float))
        results.append((out, root))
    print(
        "\nbench-projection: projected vs measured step time (error = (projected − measured) ÷ measured)"
    )
    for out, root in results:
        _print(out, args, root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
