"""`make bench-comm`: an nccl-tests-like collective benchmark as a torchrun job.

`python -m workloads.comm.bench --backend gloo --nproc 2` plans the job with the launcher's own
planner (`workloads.plan`), writes a run folder whose run.json has `kind: "comm"`,
and starts itself under torchrun (`--worker`). Every rank then times all_reduce, broadcast,
all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single (float32) over powers-of-2
message sizes: warm-up iterations, then `--iters` timed ones, each started after a barrier; an
iteration's time is the slowest rank's (an all-reduce MAX of every rank's times, as nccl-tests
reports); run.json `metrics.time_us_mean` also holds, per size, the mean, p5 and p95 of the
fastest rank's times (MIN): the rank that arrived last at the barrier's exit and waited for no
one, whose time is the collective alone, as the projection counts it. Rank 0 writes comm.csv
(median and p95 per size, algbw = bytes ÷ median time, busbw = algbw × the run-folder contract's
bus factor, profiler.runfolder.layout), the α–β fit per collective
(profiler.runfolder.commfit) into run.json, and
prints an nccl-tests-like table. Each collective's result is checked once on rank-valued tensors;
a collective that fails the check, or that the backend cannot run, is listed as skipped with why.
Message size follows nccl-tests: the larger buffer (all_gather: output; reduce_scatter: input).

The idle-penalty sweep (`--gaps-ms`, default 0 1 3 10 30 100 ms; `--gap-iters` iterations) times
all_reduce and broadcast (what DDP issues) the way training issues them: after the barrier every
rank computes (a busy loop) for the gap before the timed call, then makes the same call again at
once (back-to-back, transport awake). On CPU hosts the transport threads go idle during a step's
compute and a call issued after compute can take several times longer (docs/reference/metrics.md §10).
run.json `metrics.idle_penalty` holds both means (and the last-arriving rank's mean of the first
call) per collective, size (every other benchmarked size and the largest) and gap, so `analysis project` interpolates the penalty at whatever gap a
workload leaves before each of its buckets: one comm run serves every workload. The sweep's
compute alone is bounded by collectives × sizes × (gap iterations + 1) × Σ gaps; it is printed
before the sweep starts and its measured time (`metrics.idle_sweep_s`) after.

On CPU, the run also measures host contention (workloads.comm.host): how much k co-located ranks
computing at once slow each other, k = 1 .. ranks (`metrics.host_contention`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from tqdm import tqdm

from profiler.environment import collect_env
from profiler.runfolder.commfit import fit_all
from profiler.runfolder.errors import disk_writes, run_command
from profiler.runfolder.hostload import HostLoadMeter
from profiler.runfolder.layout import (
    COMM_COLUMNS,
    RUN_JSON,
    bus_factor,
    create_run_folder,
    utc_now,
    validate_run_id,
    write_comm_csv,
    write_run_json,
)
from profiler.runfolder.lease import Lease
from profiler.runfolder.records import read_comm_record_to_update
from profiler.runfolder.schema import CommConfig, CommMetrics, CommRunRecord, ErrorInfo
from profiler.runfolder.versions import RUN_JSON_SCHEMA_VERSION
from workloads.comm.host import ContentionSampler
from workloads.comm.idle import SWEPT, extra_lines, idle_sweep, sweep_bound_s, sweep_sizes
from workloads.comm.ops import COLLECTIVES, agreed_check, time_one
from workloads.comm.options import (
    build_parser,
    check_bytes,
    default_sizes,
    parse_collectives,
    parse_gaps,
    parse_sizes,
)
from workloads.config import TrainConfig
from workloads.launch.child import child_env, die_with_parent, user_path
from workloads.launch.guard import guarded
from workloads.launch.launcher import LaunchError
from workloads.plan import Environment, Plan, check_threads, runnable_plan

__all__ = ["COLLECTIVES", "default_sizes", "main", "parse_gaps"]

MIB = 1 << 20


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


def _time_sizes(
    name: str,
    sizes: list[int],
    n: int,
    dev: torch.device,
    args: argparse.Namespace,
    *,
    bar: tqdm,
) -> tuple[list[dict], list[dict]]:
    """(comm.csv rows, mean times) of one collective over every message size, back-to-back
    (each call right after a barrier, as nccl-tests)."""
    rows, means = [], []
    for nbytes in sizes:
        bar.update(1)
        count = nbytes // 4
        if name not in ("all_reduce", "broadcast"):
            count -= count % n  # the message must split evenly over the ranks
        if count < 1:
            continue
        t_s, _, last_s = time_one(name, count, n, dev, args.warmup, args.iters)
        t_us, last = t_s * 1e6, last_s * 1e6
        med = float(np.median(t_us))
        # The last-arriving rank's times too (no arrival skew: what the projection's comm is),
        # their mean and the p5/p95 its band takes.
        means.append({"collective": name, "bytes": count * 4, "time_us_mean": float(t_us.mean()),
                      "time_us_mean_last_arrival": float(last.mean()),
                      "time_us_p5_last_arrival": float(np.percentile(last, 5)),
                      "time_us_p95_last_arrival": float(np.percentile(last, 95))})  # fmt: skip
        algbw = count * 4 / med / 1e3  # bytes/µs -> GB/s (1e9 B)
        factor = bus_factor(name, n)
        rows.append(
            {
                "collective": name,
                "backend": args.backend,
                "world_size": n,
                "bytes": count * 4,
                "iters": args.iters,
                "time_us_median": med,
                "time_us_p95": float(np.percentile(t_us, 95)),
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * factor if factor is not None else None,
            }
        )
    return rows, means


def worker(args: argparse.Namespace) -> int:
    """One torchrun rank: benchmark every collective; rank 0 writes the results."""
    die_with_parent()  # torchrun gone (its launcher killed): this rank goes too
    use_cuda = args.device == "cuda"
    dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    torch.set_num_threads(max(1, args.threads))
    dist.init_process_group(args.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    sizes = parse_sizes(args.sizes)
    names = parse_collectives(args.collectives)
    rows, skipped, checks, means = [], [], {}, []
    meter = HostLoadMeter() if rank == 0 else None  # env.host_load: how busy the host was
    if meter is not None:
        meter.start()
    # host contention in three windows spread over the run (workloads.comm.host)
    contention = ContentionSampler(n, rank, dev, threads=max(1, args.threads))
    contention.sample()
    bar = tqdm(total=len(names) * len(sizes), desc="bench-comm", disable=rank != 0)
    for name in names:
        verdict, reason = agreed_check(name, n, rank, dev)
        if verdict is not None:
            checks[name] = verdict
        if reason is not None:
            skipped.append({"collective": name, "reason": reason})
            bar.update(len(sizes))
            continue
        got, got_means = _time_sizes(name, sizes, n, dev, args, bar=bar)
        rows += got
        means += got_means
    bar.close()
    swept = [c for c in SWEPT if c in names and c in checks and checks[c] == "ok"]
    gaps = parse_gaps(args.gaps_ms)
    if rank == 0 and gaps and swept:
        bound = sweep_bound_s(swept, sizes, gaps, args.gap_iters)
        print(f"idle-penalty sweep: {', '.join(swept)} at {len(sweep_sizes(sizes))} sizes after "
              f"{' '.join(f'{g:g}' for g in gaps)} ms of compute: at least {bound:.0f} s", flush=True)  # fmt: skip
    contention.sample()
    t0 = time.perf_counter()
    idle = idle_sweep(swept, sizes, n, dev, args) if gaps else []
    extra = {"idle_penalty": idle, "idle_sweep_s": time.perf_counter() - t0}
    contention.sample()
    extra["host_contention"] = contention.result()
    if meter is not None:
        extra["host_load"] = meter.stop()
    if rank == 0:
        run_dir = Path(args.runs_dir) / args.run_id
        _write_results(run_dir, rows, skipped, checks, args.backend, n, means=means, extra=extra)
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
    extra: dict,
) -> None:
    write_comm_csv(run_dir, rows)
    frame = pd.DataFrame(rows, columns=COMM_COLUMNS)
    models = fit_all(frame)
    out = []
    for name, g in frame.groupby("collective", sort=False):
        out.append(_table(g, str(name), backend, n))
        if name in models:
            m = models[name]
            out.append(
                f"  α–β fit: α = {m['alpha_us']:.2f} µs/step × {m['steps']} steps, "
                f"B = {m['bus_gbps']:.3f} GB/s bus; fit error mean {m['fit_error_pct_mean']:.1f}% "
                f"max {m['fit_error_pct_max']:.1f}%"
            )
    out += [f"# skipped {s['collective']}: {s['reason']}" for s in skipped]
    out += extra_lines(extra)
    text = "\n".join(out)
    print(text, flush=True)
    with disk_writes(run_dir / "logs" / "table.txt"):
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / "logs" / "table.txt").write_text(text + "\n", encoding="utf-8")
    host_load = extra.pop("host_load", None)
    record = read_comm_record_to_update(run_dir / RUN_JSON)  # the launcher's `running` record
    record = msgspec.structs.replace(
        record,
        status="ok",
        finished_at=utc_now(),
        env=msgspec.structs.replace(record.env, host_load=host_load),
        metrics=CommMetrics.from_fields(
            {
                "comm_model": models,
                "checks": checks,
                "skipped": skipped,
                "time_us_mean": means,
                **extra,
            }  # fmt: skip
        ),
    )
    write_run_json(run_dir, record)
    print(f"\nrun folder: {run_dir}  status: ok  (comm.csv, α–β fits in run.json)")


@dataclass(frozen=True)
class _Job:
    """What every rank runs: checked, with the plan's defaults filled in, before anything is
    written."""

    plan: Plan
    sizes: list[int]
    collectives: tuple[str, ...]
    gaps: tuple[float, ...]
    """The idle-penalty sweep's gaps (ms of compute before a timed call); () for none."""
    threads: int
    """torch threads per rank."""


def _job(args: argparse.Namespace) -> _Job:
    """The job the arguments ask for, on this machine; one-line LaunchError otherwise."""
    if args.nproc is not None and args.nproc < 1:  # 0 would fall back to the default count
        raise LaunchError(f"--nproc must be >= 1; got {args.nproc}")
    # Weak scaling: a collective benchmark has no batch to split, so none can refuse the plan.
    job = TrainConfig(mode="ddp", backend=args.backend, device=args.device, scaling="weak")
    plan = runnable_plan(
        job, Environment.detect(), prog="workloads.comm.bench", error=LaunchError, nproc=args.nproc
    )
    check_bytes("--max-bytes", args.max_bytes, allow_zero=True)
    try:
        check_threads(args.threads, Environment.detect())
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    max_bytes = args.max_bytes or (64 * MIB if plan.use_cuda else 16 * MIB)
    sizes = parse_sizes(args.sizes) if args.sizes else default_sizes(max_bytes)
    if args.iters < 1 or args.warmup < 0:
        raise LaunchError(
            f"--iters must be >= 1 and --warmup >= 0; got {args.iters}, {args.warmup}"
        )
    if args.gap_iters < 1:
        raise LaunchError(f"--gap-iters must be >= 1; got {args.gap_iters}")
    names = parse_collectives(args.collectives)
    gaps = parse_gaps(args.gaps_ms)
    return _Job(plan, sizes, names, gaps, args.threads or plan.threads_per_rank)


def _start_record(run_id: str, job: _Job, args: argparse.Namespace) -> CommRunRecord:
    """The run record of a comm run as it starts (status `running`)."""
    plan = job.plan
    return CommRunRecord.written(
        schema_version=RUN_JSON_SCHEMA_VERSION,
        kind="comm",
        run_id=run_id,
        status="running",
        error=None,
        created_at=utc_now(),
        finished_at=None,
        config=CommConfig.written(
            backend=plan.backend,
            world_size=plan.replicas,
            nproc_per_node=plan.nproc,
            devices=plan.devices,
            sizes_bytes=job.sizes,
            iters=args.iters,
            warmup=args.warmup,
            dtype="float32",
            collectives=list(job.collectives),
            gaps_ms=list(job.gaps),
            gap_iters=args.gap_iters,
        ),
        env=collect_env(threads_per_rank=job.threads),
        metrics=CommMetrics.written(),
    )


def _worker_argv(run_dir: Path, job: _Job, args: argparse.Namespace) -> list[str]:
    """The `--worker` command line every rank runs."""
    device = "cuda" if job.plan.use_cuda else "cpu"
    return [
        *("--worker", "--backend", job.plan.backend, "--device", device),
        *("--runs-dir", str(run_dir.parent), "--run-id", run_dir.name),
        *("--sizes", " ".join(map(str, job.sizes))),
        *("--iters", str(args.iters), "--warmup", str(args.warmup)),
        *("--threads", str(job.threads), "--collectives", " ".join(job.collectives)),
        *("--gaps-ms", " ".join(f"{g:g}" for g in job.gaps) or "none"),
        *("--gap-iters", str(args.gap_iters)),
    ]


def _finish(run_dir: Path, code: int) -> int:
    """The exit code; the run is marked failed (torchrun's exit code) unless rank 0 recorded
    it `ok` and torchrun exited 0."""
    record = read_comm_record_to_update(run_dir / RUN_JSON)  # rank 0's `ok` record, or ours
    if code == 0 and record.status == "ok":
        return 0
    record = msgspec.structs.replace(
        record,
        status="failed",
        finished_at=utc_now(),
        error=ErrorInfo.written(
            message=f"torchrun exited with code {code}; see the output above",
            rank=None,
            exit_code=code,
            log_tail=[],
        ),
    )
    write_run_json(run_dir, record)
    print(f"run folder: {run_dir}  status: failed (torchrun exit code {code})")
    return 1


def launch(args: argparse.Namespace) -> int:
    """Plan with the launcher's validation, write the run folder, start the ranks under torchrun."""
    if args.run_id:
        validate_run_id(args.run_id)
    job = _job(args)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    run_id = args.run_id or f"comm-{job.plan.backend}-n{job.plan.replicas}-{stamp}"
    run_dir = create_run_folder(user_path(args.runs_dir), run_id, writer="bench-comm")
    with disk_writes(run_dir / "logs"):
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    write_run_json(run_dir, _start_record(run_id, job, args))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc-per-node", str(job.plan.nproc), "-m", "workloads.comm.bench"]
    cmd = guarded([*cmd, *_worker_argv(run_dir, job, args)])  # it dies with this process
    env = child_env(PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(job.threads))
    env.setdefault("KINETO_LOG_LEVEL", "5")
    with disk_writes(run_dir / "logs"):
        (run_dir / "logs" / "launcher.log").write_text("$ " + " ".join(cmd) + "\n")
    lease = Lease(run_dir, "bench-comm")
    try:
        code = subprocess.run(cmd, env=env).returncode
    finally:
        lease.stop()
    return _finish(run_dir, code)


def main(argv: list[str] | None = None, *, prog: str = "python -m workloads.comm.bench") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.worker:
        return worker(args)
    return run_command(prog, lambda: launch(args))


if __name__ == "__main__":
    sys.exit(main())
