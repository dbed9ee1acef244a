"""The launcher behind `make profile-*`: `python -m workloads.launch --mode single|dp|ddp|all ...`.

It checks what this machine can run (one clear line and exit code 2 otherwise), writes
`run.json` with status `running` and the config, starts the training — `workloads.train` directly
for single/DP, through torchrun (`python -m torch.distributed.run`) for DDP — relays its output to
the console and `logs/launcher.log`, and afterwards turns a crash into `status: failed` with the
failing rank, its exit code and the last lines of its log. `--mode all` runs every mode this
machine supports and records the others as `status: skipped` with the reason. The training runs
under workloads.supervise: a heartbeat watchdog ends a hung job, Ctrl-C/SIGTERM stops every
process, and runlog.finalize gives each failed run its `error.kind` (never downgrading `ok`).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from profiler.record import SCHEMA_VERSION, collect_env, write_json_atomic
from workloads.config import (
    TrainConfig,
    add_config_arguments,
    batch_split,
    config_from_namespace,
    config_record,
    default_run_id,
    to_argv,
)
from workloads.context import cpu_cores, resolve_backend
from workloads.data import check_available
from workloads.runlog import finalize, utc_now
from workloads.supervise import flight_recorder_env, run_supervised

__all__ = ["LaunchError", "Plan", "main", "validate"]

REPO = Path(__file__).resolve().parents[1]
ALL_MODES = (("single", "auto"), ("dp", "auto"), ("ddp", "nccl"), ("ddp", "gloo"))
# The watchdog waits this much longer than --collective-timeout, so that a rank's own timeout
# error (and NCCL's flight-recorder dump) comes first when a rank hangs in a collective.
WATCHDOG_GRACE_S = 10.0


class LaunchError(Exception):
    """What the user asked for cannot run here; the message is one line that says what to do."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A validated run: mode, resolved backend and the devices it will use."""

    mode: str
    backend: str
    """nccl | gloo for ddp, none otherwise."""
    nproc: int
    """Processes per node (1 for single and DP)."""
    replicas: int
    """Model replicas over the whole job: DDP ranks, DP GPUs, or 1."""
    devices: list[str]
    threads_per_rank: int


def validate(
    mode: str,
    backend: str,
    *,
    nproc: int | None,
    device: str = "auto",
    nnodes: int = 1,
    sync_bn: bool = False,
) -> Plan:
    """Check that `mode`/`backend` can run on this machine; raise LaunchError saying why not."""
    system = platform.system()  # looked up per call so tests can patch the platform
    if device == "cuda" and not torch.cuda.is_available():
        raise LaunchError("--device cuda but torch sees no CUDA device; use --device cpu or auto")
    use_cuda = device != "cpu" and torch.cuda.is_available()
    gpus = torch.cuda.device_count() if use_cuda else 0
    if mode == "single":
        return Plan(
            mode=mode,
            backend="none",
            nproc=1,
            replicas=1,
            devices=["cuda:0" if use_cuda else "cpu"],
            threads_per_rank=_threads(use_cuda, 1),
        )
    if mode == "dp":
        if gpus < 1:
            raise LaunchError(
                "--mode dp needs at least one CUDA device (nn.DataParallel is GPU-only) and none is "
                "visible; use --mode single, or --mode ddp --backend gloo on CPU"
            )
        count = nproc or gpus
        if count > gpus:
            raise LaunchError(
                f"--nproc {count} is above the {gpus} visible GPU(s); use --nproc {gpus} or fewer"
            )
        return Plan(
            mode=mode,
            backend="none",
            nproc=1,
            replicas=count,
            devices=[f"cuda:{i}" for i in range(count)],
            threads_per_rank=_threads(True, 1),
        )
    if mode != "ddp":
        raise LaunchError(f"--mode must be single, dp, ddp or all; got {mode!r}")
    resolved = resolve_backend(backend, use_cuda=use_cuda)
    if resolved == "nccl" and system == "Windows":
        raise LaunchError(
            "NCCL is not available on Windows; use --backend gloo (what auto picks there)"
        )
    if resolved == "nccl" and not use_cuda:
        raise LaunchError(
            "--backend nccl needs CUDA GPUs and torch sees none; use --backend gloo (or auto)"
        )
    if resolved == "nccl" and not dist.is_nccl_available():
        raise LaunchError("this torch build has no NCCL; use --backend gloo")
    count = nproc or (gpus if use_cuda else 2)
    if count < 1:
        raise LaunchError(f"--nproc must be >= 1; got {count}")
    if use_cuda and count > gpus:
        raise LaunchError(
            f"--nproc {count} is above the {gpus} visible GPU(s); use --nproc {gpus} or fewer "
            "(one process per GPU), or --device cpu"
        )
    if sync_bn and not use_cuda:
        raise LaunchError(
            "--sync-bn needs CUDA devices (SyncBatchNorm is GPU-only); drop --sync-bn on CPU"
        )
    if not use_cuda and count > cpu_cores():
        print(
            f"workloads.launch: warning: --nproc {count} exceeds the {cpu_cores()} CPU cores; ranks "
            "will time-share cores (1 thread each) and step times will not be representative",
            file=sys.stderr,
        )
    devices = [f"cuda:{i}" if use_cuda else "cpu" for _ in range(nnodes) for i in range(count)]
    return Plan(
        mode=mode,
        backend=resolved,
        nproc=count,
        replicas=count * nnodes,
        devices=devices,
        threads_per_rank=_threads(use_cuda, count),
    )


def _threads(use_cuda: bool, nproc: int) -> int:
    """Threads each rank will use: CPU ranks split the cores (cores // nproc), as train does."""
    return torch.get_num_threads() if use_cuda else max(1, cpu_cores() // nproc)


def _record(
    cfg: TrainConfig, plan: Plan, *, nnodes: int, status: str, error: dict | None = None
) -> dict:
    fields = dict(
        backend=plan.backend,
        world_size=plan.replicas,
        nnodes=nnodes,
        nproc_per_node=plan.nproc,
        devices=plan.devices,
    )
    try:
        config = config_record(cfg, **fields, replicas=plan.replicas)
    except ValueError:  # a skipped mode whose replica count does not divide the batch
        config = config_record(cfg, **fields, replicas=1)
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": cfg.run_id,
        "status": status,
        "error": error,
        "created_at": utc_now(),
        "finished_at": None if status == "running" else utc_now(),
        "config": config,
        "env": collect_env(threads_per_rank=plan.threads_per_rank),
        "metrics": {},
        "eval": {"epochs": [], "best": None},
        "traces": [],
    }


def _command(cfg: TrainConfig, plan: Plan, args: argparse.Namespace, extra: list[str]) -> list[str]:
    train_argv = [*to_argv(cfg), *extra]
    if plan.mode != "ddp":
        return [sys.executable, "-m", "workloads.train", *train_argv]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(plan.nproc)]
    if args.nnodes == 1 and not args.rdzv_endpoint:
        cmd.append("--standalone")  # local c10d store on a free port: parallel runs never collide
    else:
        cmd += [
            "--nnodes",
            str(args.nnodes),
            "--node-rank",
            str(args.node_rank),
            "--rdzv-backend",
            args.rdzv_backend,
            "--rdzv-endpoint",
            args.rdzv_endpoint,
            "--rdzv-id",
            cfg.run_id,
        ]
    restarts = ["--max-restarts", str(args.max_restarts)]
    return [*cmd, *restarts, "-m", "workloads.train", *train_argv]


def _execute(cfg: TrainConfig, plan: Plan, args: argparse.Namespace, extra: list[str]) -> str:
    """Run one planned training; return its final status."""
    run_dir = Path(cfg.runs_dir) / cfg.run_id
    is_record_node = args.node_rank == 0
    if is_record_node and (run_dir / "run.json").exists():
        raise LaunchError(
            f"run folder {run_dir} already holds a run; pick another --run-id or remove it"
        )
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    if is_record_node:
        write_json_atomic(
            run_dir / "run.json", _record(cfg, plan, nnodes=args.nnodes, status="running")
        )
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if not plan.devices[0].startswith("cuda"):
        # What train sets anyway; it also silences torchrun's OMP_NUM_THREADS note.
        env["OMP_NUM_THREADS"] = str(cfg.threads or plan.threads_per_rank)
        # A CUDA build of torch on a machine without a GPU makes Kineto log a harmless
        # "ERROR ... gpuGetDeviceCount failed" at every trace; level 5 keeps CPU logs clean.
        env.setdefault("KINETO_LOG_LEVEL", "5")
    if plan.backend == "nccl":
        env = {**flight_recorder_env(run_dir / "logs"), **env}
    log_name = "launcher.log" if is_record_node else f"launcher-node{args.node_rank}.log"
    launcher_log = run_dir / "logs" / log_name
    outcome = run_supervised(
        _command(cfg, plan, args, extra),
        cwd=REPO,
        env=env,
        log_path=launcher_log,
        logs=run_dir / "logs",
        stall_s=cfg.collective_timeout + WATCHDOG_GRACE_S,
    )
    returncode = outcome.returncode
    if not is_record_node:
        print(
            f"node {args.node_rank} finished (exit code {returncode}); node 0 writes {run_dir / 'run.json'}"
        )
        return "ok" if returncode == 0 else "failed"
    record = finalize(run_dir, outcome, launcher_log)
    print(f"\nrun folder: {run_dir}  status: {record['status']}")
    if record["status"] == "failed":
        print(
            f"  error ({record['error']['kind']}): {record['error']['message']}\n"
            f"  logs:  {run_dir / 'logs'}"
        )
    return "interrupted" if outcome.interrupted and record["status"] != "ok" else record["status"]


def _skip(cfg: TrainConfig, plan: Plan, nnodes: int, reason: str) -> None:
    run_dir = Path(cfg.runs_dir) / cfg.run_id
    error = {"message": reason, "rank": None, "exit_code": None, "log_tail": []}
    write_json_atomic(
        run_dir / "run.json", _record(cfg, plan, nnodes=nnodes, status="skipped", error=error)
    )
    print(f"\nrun folder: {run_dir}  status: skipped ({reason})")


def _skipped_plan(mode: str, backend: str, nproc: int | None, nnodes: int) -> Plan:
    count = 1 if mode == "single" else (nproc or 2)
    return Plan(
        mode=mode,
        backend="none" if mode != "ddp" else backend,
        nproc=1 if mode == "dp" else count,
        replicas=count * (nnodes if mode == "ddp" else 1),
        devices=[],
        threads_per_rank=1,
    )


def run(args: argparse.Namespace, extra: list[str]) -> int:
    """Plan, validate and execute the requested run(s); return the process exit code."""
    if args.mode == "all" and args.run_id:
        raise LaunchError("--run-id names one run but --mode all makes four; leave --run-id out")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise LaunchError(
            f"--node-rank must be in [0, --nnodes); got {args.node_rank} with --nnodes {args.nnodes}"
        )
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise LaunchError(
            "--nnodes > 1 needs --rdzv-endpoint HOST:PORT (node 0's address, same on every node)"
        )
    if args.max_restarts < 0:
        raise LaunchError(f"--max-restarts must be >= 0; got {args.max_restarts}")
    if args.max_restarts and args.mode != "ddp":
        raise LaunchError(
            "--max-restarts restarts torchrun's workers, so it needs --mode ddp "
            "(run single-device as --mode ddp --nproc 1 to get restarts)"
        )
    if args.nnodes > 1 and args.mode != "ddp":
        raise LaunchError("--nnodes > 1 only makes sense with --mode ddp")
    init_method = ""
    if args.rdzv_file:
        path = Path(args.rdzv_file).resolve()
        if args.nnodes == 1:
            path.unlink(missing_ok=True)  # a file left by an earlier run would break the rendezvous
        path.parent.mkdir(parents=True, exist_ok=True)
        init_method = path.as_uri()  # file:///... (file:///C:/... on Windows)
    check_available(args.dataset, args.data_dir, download=args.download)
    if extra:
        print(f"workloads.launch: passing to workloads.train: {' '.join(extra)}", file=sys.stderr)
    statuses = []
    for mode, backend in ALL_MODES if args.mode == "all" else ((args.mode, args.backend),):
        # DP's GPU count is --nproc (as `make profile-all NPROC=` passes it) or --dp-gpus.
        nproc = (args.nproc or args.dp_gpus or None) if mode == "dp" else args.nproc
        try:
            plan = validate(
                mode,
                backend,
                nproc=nproc,
                device=args.device,
                nnodes=args.nnodes,
                sync_bn=args.sync_bn,
            )
        except LaunchError as exc:
            if args.mode != "all" and not args.skip_impossible:
                raise
            plan = _skipped_plan(mode, backend, nproc, args.nnodes)
            cfg = config_from_namespace(args, mode=mode, backend=backend, init_method=init_method)
            cfg.run_id = cfg.run_id or default_run_id(
                cfg, backend=plan.backend, world_size=plan.replicas
            )
            _skip(cfg, plan, args.nnodes, str(exc))
            statuses.append("skipped")
            continue
        resolved = plan.backend if plan.backend != "none" else "auto"
        # The planned DP GPUs must reach train, which otherwise spreads over every visible GPU.
        dp_gpus = plan.replicas if mode == "dp" else args.dp_gpus
        cfg = config_from_namespace(
            args, mode=mode, backend=resolved, init_method=init_method, dp_gpus=dp_gpus
        )
        cfg.run_id = cfg.run_id or default_run_id(
            cfg, backend=plan.backend, world_size=plan.replicas
        )
        try:  # a batch that does not divide fails here, before any process starts
            batch_split(cfg, plan.replicas)
        except ValueError as exc:
            if args.mode != "all" and not args.skip_impossible:
                raise
            _skip(cfg, plan, args.nnodes, str(exc))  # impossible with this batch: skipped
            statuses.append("skipped")
            continue
        statuses.append(_execute(cfg, plan, args, extra))
        if statuses[-1] == "interrupted":
            break  # the user stopped the job: start no further mode
    if args.node_rank == 0:
        print(
            f"\nnext: make report RUNS={args.runs_dir}   (or: python -m analysis.report {args.runs_dir} --out reports)"
        )
        print(
            f"      make tensorboard RUNS={args.runs_dir}   (traces in TensorBoard's profiler plugin)"
        )
    if "interrupted" in statuses:
        return 130
    return 1 if "failed" in statuses else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workloads.launch",
        description="Profile the same training as single-device, DataParallel and DDP runs; one "
        "run folder per run under --runs-dir. Unknown arguments are passed to workloads.train.",
    )
    parser.add_argument(
        "--mode",
        choices=("single", "dp", "ddp", "all"),
        default="single",
        help="all = single, dp, ddp-nccl, ddp-gloo as this machine allows (others: skipped)",
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "nccl", "gloo"),
        default="auto",
        help="DDP backend; auto = nccl on Linux with CUDA, gloo otherwise",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="DDP processes per node (default: GPU count, 2 on CPU); DP: GPUs to use",
    )
    parser.add_argument("--nnodes", type=int, default=1, help="nodes in a multi-node DDP job")
    parser.add_argument(
        "--node-rank", type=int, default=0, help="this node's index in [0, --nnodes)"
    )
    parser.add_argument(
        "--rdzv-endpoint", default="", help="HOST:PORT of node 0 for multi-node runs"
    )
    parser.add_argument(
        "--rdzv-backend",
        choices=("static", "c10d"),
        default="static",
        help="torchrun rendezvous for multi-node: static honours --node-rank",
    )
    parser.add_argument(
        "--rdzv-file",
        default="",
        help="file:// rendezvous: a path every rank can reach; becomes init_method",
    )
    parser.add_argument(
        "--skip-impossible",
        action="store_true",
        help="record a mode this machine can't run as status: skipped (as --mode all does) "
        "instead of exiting with an error; what `make profile-sweep` uses",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="ddp: torchrun restarts the job this many times after a rank fails; each restart "
        "resumes from the last checkpoint.pt (see --checkpoint-every)",
    )
    add_config_arguments(parser, exclude=("mode", "backend", "init_method"))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    try:
        return run(args, extra)
    except (LaunchError, ValueError) as exc:  # DataError and config ValueErrors are user errors too
        print(f"workloads.launch: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
