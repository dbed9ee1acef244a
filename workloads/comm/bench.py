"""`make bench-comm`: an nccl-tests-like collective benchmark as a torchrun job.

`python -m workloads.comm.bench --backend gloo --nproc 2` plans the job with the launcher's own
planner (`workloads.plan`), writes a run folder whose run.json has `kind: "comm"`,
and starts itself under torchrun (`--worker`). Every rank then times all_reduce, broadcast,
all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single (float32) over powers-of-2
message sizes: warm-up iterations, then `--iters` timed ones, each started after a barrier; an
iteration's time is the slowest rank's (an all-reduce MAX of every rank's times, as nccl-tests
reports). Rank 0 writes comm.csv (median and p95 per size, algbw = bytes ÷ median time, busbw =
algbw × the analysis's bus factor), the α–β fit per collective (analysis.project.comm) into run.json, and
prints an nccl-tests-like table. Each collective's result is checked once on rank-valued tensors;
a collective that fails the check, or that the backend cannot run, is listed as skipped with why.
Message size follows nccl-tests: the larger buffer (all_gather: output; reduce_scatter: input).

`--gap-ms` times each collective the way training issues it: after the barrier every rank computes
(a busy loop) for that many milliseconds before the timed call. nccl-tests' back-to-back timing
(gap 0, the default) is what NCCL on GPUs shows in training too; on CPU hosts the transport
threads go idle during a step's compute, and a collective issued after compute can take several
times longer (docs/analysis.md §10). With a gap, each iteration also times a second call right
after the first (back-to-back, transport awake): comm.csv keeps the first call's times, run.json
both means (`metrics.time_us_mean`: `time_us_mean`, `time_us_mean_back_to_back`), so `analysis
project` can take the idle penalty (their difference) once per call and the ring steps from the
back-to-back times. `--collectives` limits the run to some collectives.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from tqdm import tqdm

from analysis.project.comm import COMM_COLUMNS, fit_all
from analysis.trace.collectives import bus_factor
from profiler.errors import OneLineParser, run_command
from profiler.record import SCHEMA_VERSION, collect_env, write_csv_atomic, write_json_atomic
from workloads.comm.ops import COLLECTIVES, check, time_one
from workloads.config import TrainConfig
from workloads.launch.launcher import LaunchError
from workloads.launch.runlog import utc_now
from workloads.plan import Environment, runnable_plan

__all__ = ["COLLECTIVES", "default_sizes", "main", "parse_gaps"]

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def default_sizes(max_bytes: int) -> list[int]:
    """Powers of 2 from 4 B (one float32) to `max_bytes`."""
    sizes, s = [], 4
    while s <= max_bytes:
        sizes.append(s)
        s *= 2
    return sizes


def parse_gaps(text: str, collectives: tuple[str, ...] = COLLECTIVES) -> dict[str, float]:
    """`--gap-ms`: '' (none), one number for every collective, or 'all_reduce=40,broadcast=1'."""
    text = str(text).strip()
    if not text:
        return {}
    try:
        if "=" not in text:
            gaps = dict.fromkeys(collectives, float(text))
        else:
            gaps = {k.strip(): float(v) for k, v in (t.split("=", 1) for t in text.split(","))}
    except ValueError:
        gaps = None
    if gaps is None or any(k not in COLLECTIVES or not 0 <= v <= 10_000 for k, v in gaps.items()):
        raise LaunchError(
            "--gap-ms must be milliseconds (0 to 10000), one number or "
            f"'all_reduce=40,broadcast=1' with names from {', '.join(COLLECTIVES)}; got {text!r}"
        )
    return {k: v for k, v in gaps.items() if v > 0}


def _parse_collectives(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(t for t in text.replace(",", " ").split())) or COLLECTIVES
    unknown = [t for t in names if t not in COLLECTIVES]
    if unknown:
        raise LaunchError(
            f"--collectives must name some of {', '.join(COLLECTIVES)}; got {', '.join(unknown)}"
        )
    return names


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(t) for t in text.replace(",", " ").split()})
    except ValueError:
        raise LaunchError(
            f"--sizes must be byte counts like '1024 1048576'; got {text!r}"
        ) from None
    if not sizes or sizes[0] < 4:
        raise LaunchError(f"--sizes must be >= 4 bytes (one float32); got {text!r}")
    return sizes


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _table(frame: pd.DataFrame, name: str, backend: str, n: int) -> str:
    lines = [
        f"# {name}  backend {backend}  world_size {n}  (float32; time = slowest rank per "
        "iteration; GB = 1e9 B)",
        f"# {'size(B)':>12} {'count':>10} {'time_med(us)':>13} {'time_p95(us)':>13} "
        f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12}",
    ]
    for r in frame.itertuples():
        busbw = "-" if pd.isna(r.busbw_gbps) else f"{r.busbw_gbps:12.3f}"
        lines.append(
            f"  {r.bytes:>12} {r.bytes // 4:>10} {r.time_us_median:>13.1f} "
            f"{r.time_us_p95:>13.1f} {r.algbw_gbps:>12.3f} {busbw:>12}"
        )
    return "\n".join(lines)


def worker(args: argparse.Namespace) -> int:
    """One torchrun rank: benchmark every collective; rank 0 writes the results."""
    backend = args.backend
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = args.device == "cuda"
    dev = torch.device(f"cuda:{local}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    torch.set_num_threads(max(1, args.threads))
    dist.init_process_group(backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    run_dir = Path(args.runs_dir) / args.run_id
    sizes = _parse_sizes(args.sizes)
    names = _parse_collectives(args.collectives)
    gaps = parse_gaps(args.gap_ms, names)
    rows, skipped, checks, means = [], [], {}, []
    bar = tqdm(total=len(names) * len(sizes), desc="bench-comm", disable=rank != 0)
    for name in names:
        try:
            ok = check(name, n, rank, dev)
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            skipped.append({"collective": name, "reason": _first_line(exc)})
            bar.update(len(sizes))
            continue
        flag = torch.tensor([1.0 if ok else 0.0], device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # every rank agrees on the verdict
        checks[name] = "ok" if flag.item() == 1.0 else "wrong result"
        if checks[name] != "ok":
            skipped.append({"collective": name, "reason": "result check failed (wrong values)"})
            bar.update(len(sizes))
            continue
        for nbytes in sizes:
            bar.update(1)
            count = nbytes // 4
            if name not in ("all_reduce", "broadcast"):
                count -= count % n  # the message must split evenly over the ranks
            if count < 1:
                continue
            gap_s = gaps.get(name, 0.0) / 1e3
            t_s, hot_s = time_one(name, count, n, dev, args.warmup, args.iters, gap_s)
            t_us = t_s * 1e6
            med = float(np.median(t_us))
            mean = {"collective": name, "bytes": count * 4, "time_us_mean": float(t_us.mean())}
            if hot_s is not None:  # the same message again at once: no idle transport to wake
                mean["time_us_mean_back_to_back"] = float(hot_s.mean() * 1e6)
            means.append(mean)
            algbw = count * 4 / med / 1e3  # bytes/µs -> GB/s (1e9 B)
            factor = bus_factor(name, n)
            rows.append(
                {
                    "collective": name,
                    "backend": backend,
                    "world_size": n,
                    "bytes": count * 4,
                    "iters": args.iters,
                    "time_us_median": med,
                    "time_us_p95": float(np.percentile(t_us, 95)),
                    "algbw_gbps": algbw,
                    "busbw_gbps": algbw * factor if factor is not None else None,
                }
            )
    bar.close()
    if rank == 0:
        _write_results(run_dir, rows, skipped, checks, backend, n, means=means, gaps=gaps)
    dist.destroy_process_group()
    return 0


def _write_results(
    run_dir: Path,
    rows: list[dict],
    skipped: list[dict],
    checks: dict,
    backend: str,
    n: int,
    *,
    means: list[dict],
    gaps: dict[str, float],
) -> None:
    import json

    write_csv_atomic(run_dir / "comm.csv", rows, COMM_COLUMNS)
    frame = pd.DataFrame(rows, columns=COMM_COLUMNS)
    models = fit_all(frame)
    out = []
    for name, g in frame.groupby("collective", sort=False):
        out.append(_table(g, str(name), backend, n))
        if gaps.get(str(name)):
            out.append(f"  (each call timed after {gaps[str(name)]:g} ms of compute: --gap-ms)")
        if name in models:
            m = models[name]
            out.append(
                f"  α–β fit: α = {m['alpha_us']:.2f} µs/step × {m['steps']} steps, "
                f"B = {m['bus_gbps']:.3f} GB/s bus; fit error mean {m['fit_error_pct_mean']:.1f}% "
                f"max {m['fit_error_pct_max']:.1f}%"
            )
    out += [f"# skipped {s['collective']}: {s['reason']}" for s in skipped]
    text = "\n".join(out)
    print(text, flush=True)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "logs" / "table.txt").write_text(text + "\n", encoding="utf-8")
    record = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    record.update(
        status="ok",
        finished_at=utc_now(),
        metrics={
            "comm_model": models,
            "checks": checks,
            "skipped": skipped,
            "time_us_mean": means,
        },
    )
    write_json_atomic(run_dir / "run.json", record)
    print(f"\nrun folder: {run_dir}  status: ok  (comm.csv, α–β fits in run.json)")


def launch(args: argparse.Namespace) -> int:
    """Plan with the launcher's validation, write the run folder, start the ranks under torchrun."""
    if args.nproc is not None and args.nproc < 1:  # 0 would fall back to the default count
        raise LaunchError(f"--nproc must be >= 1; got {args.nproc}")
    # Weak scaling: a collective benchmark has no batch to split, so none can refuse the plan.
    job = TrainConfig(mode="ddp", backend=args.backend, device=args.device, scaling="weak")
    plan = runnable_plan(
        job, Environment.detect(), prog="workloads.comm.bench", error=LaunchError, nproc=args.nproc
    )
    use_cuda = plan.use_cuda
    max_bytes = args.max_bytes or (64 * MIB if use_cuda else 16 * MIB)
    sizes = _parse_sizes(args.sizes) if args.sizes else default_sizes(max_bytes)
    if args.iters < 1 or args.warmup < 0:
        raise LaunchError(
            f"--iters must be >= 1 and --warmup >= 0; got {args.iters}, {args.warmup}"
        )
    names = _parse_collectives(args.collectives)
    gaps = parse_gaps(args.gap_ms, names)
    threads = args.threads or plan.threads_per_rank
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    run_id = args.run_id or f"comm-{plan.backend}-n{plan.replicas}-{stamp}"
    run_dir = Path(args.runs_dir) / run_id
    if (run_dir / "run.json").exists():
        raise LaunchError(f"run folder {run_dir} already holds a run; pick another --run-id")
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    record = {
        "schema_version": SCHEMA_VERSION,
        "kind": "comm",
        "run_id": run_id,
        "status": "running",
        "error": None,
        "created_at": utc_now(),
        "finished_at": None,
        "config": {
            "backend": plan.backend,
            "world_size": plan.replicas,
            "nproc_per_node": plan.nproc,
            "devices": plan.devices,
            "sizes_bytes": sizes,
            "iters": args.iters,
            "warmup": args.warmup,
            "dtype": "float32",
            "collectives": list(names),
            "gap_ms": gaps,
        },
        "env": collect_env(threads_per_rank=threads),
        "metrics": {},
    }
    write_json_atomic(run_dir / "run.json", record)
    worker_argv = [
        "--worker",
        "--backend",
        plan.backend,
        "--device",
        "cuda" if use_cuda else "cpu",
        "--runs-dir",
        str(args.runs_dir),
        "--run-id",
        run_id,
        "--sizes",
        " ".join(map(str, sizes)),
        "--iters",
        str(args.iters),
        "--warmup",
        str(args.warmup),
        "--threads",
        str(threads),
        "--collectives",
        " ".join(names),
        "--gap-ms",
        ",".join(f"{k}={v:g}" for k, v in gaps.items()),
    ]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc-per-node", str(plan.nproc), "-m", "workloads.comm.bench", *worker_argv]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads))
    env.setdefault("KINETO_LOG_LEVEL", "5")
    with open(run_dir / "logs" / "launcher.log", "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
    code = subprocess.run(cmd, cwd=REPO, env=env).returncode
    import json

    record = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    if code != 0 or record.get("status") != "ok":
        record.update(
            status="failed",
            finished_at=utc_now(),
            error={
                "message": f"torchrun exited with code {code}; see the output above",
                "rank": None,
                "exit_code": code,
                "log_tail": [],
            },
        )
        write_json_atomic(run_dir / "run.json", record)
        print(f"run folder: {run_dir}  status: failed (torchrun exit code {code})")
        return 1
    return 0


def build_parser(prog: str = "python -m workloads.comm.bench") -> argparse.ArgumentParser:
    p = OneLineParser(prog=prog, description=__doc__.split("\n")[0])
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
        "--gap-ms",
        default="",
        help="compute (ms) before each timed call, as in training: one number or "
        "'all_reduce=40,broadcast=1' (default 0: back-to-back, as nccl-tests)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None, *, prog: str = "python -m workloads.comm.bench") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.worker:
        return worker(args)
    return run_command(prog, lambda: launch(args))


if __name__ == "__main__":
    sys.exit(main())
