"""The launcher behind `make profile-*`: `python -m workloads.launch --mode single|dp|ddp|all ...`.

It checks what this machine can run (one clear line and exit code 2 otherwise), writes
`run.json` with status `running` and the config, starts the training — `workloads.train` directly
for single/DP, through torchrun (`python -m torch.distributed.run`) for DDP — relays its output to
the console and `logs/launcher.log`, and afterwards turns a crash into `status: failed` with the
failing rank, its exit code and the last lines of its log. `--mode all` runs every mode this
machine supports and records the others as `status: skipped` with the reason. The training runs
under workloads.launch.supervise: a heartbeat watchdog ends a hung job, Ctrl-C/SIGTERM stops every
process, and runlog.finalize gives each failed run its `error.kind` (never downgrading `ok`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from profiler.runfolder.errors import UserError, run_command
from profiler.runfolder.layout import RUN_JSON, write_run_json
from workloads.config import (
    OneLineParser,
    TrainConfig,
    add_config_arguments,
    config_from_namespace,
    default_run_id,
    to_argv,
)
from workloads.launch.child import child_env, user_path
from workloads.launch.rounds import (
    ModeResult,
    add_repeat_arguments,
    check_repeat,
    repeat_id,
    run_rounds,
)
from workloads.launch.runlog import finalize
from workloads.launch.script import ScriptError, next_lines, parse_script_args, run_script
from workloads.launch.supervise import flight_recorder_env, run_supervised
from workloads.plan import Environment, Plan
from workloads.plan import plan as plan_run
from workloads.record import run_record
from workloads.train.workload import WorkloadFacts, check_workload

__all__ = ["LaunchError", "main"]

ALL_MODES = (("single", "auto"), ("dp", "auto"), ("ddp", "nccl"), ("ddp", "gloo"))
# The watchdog waits this much longer than --collective-timeout, so that a rank's own timeout
# error (and NCCL's flight-recorder dump) comes first when a rank hangs in a collective.
WATCHDOG_GRACE_S = 10.0


class LaunchError(UserError):
    """What the user asked for cannot run here; the message is one line that says what to do."""


def _record(
    cfg: TrainConfig,
    plan: Plan,
    workload: WorkloadFacts,
    *,
    status: str,
    error: dict | None = None,
) -> dict:
    return run_record(
        cfg,
        plan,
        status=status,
        threads_per_rank=plan.threads_per_rank,
        error=error,
        workload=workload,
    )


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


def _execute(
    cfg: TrainConfig,
    plan: Plan,
    args: argparse.Namespace,
    extra: list[str],
    workload: WorkloadFacts,
) -> str:
    """Run one planned training; return its final status."""
    run_dir = Path(cfg.runs_dir) / cfg.run_id
    is_record_node = args.node_rank == 0
    if is_record_node and (run_dir / RUN_JSON).exists():
        raise LaunchError(
            f"run folder {run_dir} already holds a run; pick another --run-id or remove it"
        )
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    if is_record_node:
        write_run_json(run_dir, _record(cfg, plan, workload, status="running"))
    env = child_env(PYTHONUNBUFFERED="1")
    if not plan.use_cuda:
        # What train sets anyway; it also silences torchrun's OMP_NUM_THREADS note.
        env["OMP_NUM_THREADS"] = str(plan.threads_per_rank)
        # A CUDA build of torch on a machine without a GPU makes Kineto log a harmless
        # "ERROR ... gpuGetDeviceCount failed" at every trace; level 5 keeps CPU logs clean.
        env.setdefault("KINETO_LOG_LEVEL", "5")
    if plan.backend == "nccl":
        env = {**flight_recorder_env(run_dir / "logs"), **env}
    log_name = "launcher.log" if is_record_node else f"launcher-node{args.node_rank}.log"
    launcher_log = run_dir / "logs" / log_name
    outcome = run_supervised(
        _command(cfg, plan, args, extra),
        env=env,
        log_path=launcher_log,
        logs=run_dir / "logs",
        stall_s=cfg.collective_timeout + WATCHDOG_GRACE_S,
    )
    returncode = outcome.returncode
    if not is_record_node:
        print(
            f"node {args.node_rank} finished (exit code {returncode}); node 0 writes {run_dir / RUN_JSON}"
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


def _skip(cfg: TrainConfig, plan: Plan, workload: WorkloadFacts) -> None:
    run_dir = Path(cfg.runs_dir) / cfg.run_id
    error = {"message": plan.reason, "rank": None, "exit_code": None, "log_tail": []}
    write_run_json(run_dir, _record(cfg, plan, workload, status="skipped", error=error))
    print(f"\nrun folder: {run_dir}  status: skipped ({plan.reason})")


def _check_arguments(args: argparse.Namespace) -> None:
    """Launcher-only arguments that are wrong on any machine: one line each, nothing written."""
    if args.mode == "all" and args.run_id:
        raise LaunchError("--run-id names one run but --mode all makes four; leave --run-id out")
    try:
        check_repeat(args)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    if args.nproc is not None and args.nproc < 1:
        raise LaunchError(f"--nproc must be >= 1; got {args.nproc} (leave it out for the default)")
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
    runs = Path(args.runs_dir)
    existing = next(p for p in (runs, *runs.parents) if p.exists())
    if not existing.is_dir():
        raise LaunchError(
            f"--runs-dir {runs}: {existing} is a file, not a folder; pass a folder (make: RUNS=DIR)"
        )


def _absolute_paths(args: argparse.Namespace) -> None:
    """--runs-dir, --data-dir and --rdzv-file against the folder the user ran the command in,
    once, so that every child, record and message sees the same absolute path."""
    args.runs_dir = str(user_path(args.runs_dir))
    args.data_dir = str(user_path(args.data_dir))
    if args.rdzv_file:
        args.rdzv_file = str(user_path(args.rdzv_file))


def _one_round(
    args: argparse.Namespace,
    extra: list[str],
    workload: WorkloadFacts,
    env: Environment,
    init_method: str,
    rounds: tuple[str, int],
) -> list[ModeResult]:
    """Plan and execute each requested mode once (one round of `--repeat`); stops at an
    interrupted run. `rounds`: (repeat id, round), ("", 0) outside rounds."""
    (rounds_id, k), results = rounds, []
    for mode, backend in ALL_MODES if args.mode == "all" else ((args.mode, args.backend),):
        # DP's GPU count is --nproc (as `make profile-all NPROC=` passes it) or --dp-gpus.
        dp_gpus = (args.nproc or args.dp_gpus) if mode == "dp" else args.dp_gpus
        cfg = config_from_namespace(args, mode=mode, backend=backend, init_method=init_method,
                                    dp_gpus=dp_gpus, repeat_id=rounds_id, repeat_round=k)  # fmt: skip
        plan = plan_run(cfg, env, nproc=args.nproc, nnodes=args.nnodes)
        label = f"ddp-{plan.backend}" if mode == "ddp" else mode
        if k == 0:
            for warning in plan.warnings:
                print(f"workloads.launch: warning: {warning}", file=sys.stderr)
        if not cfg.run_id:
            run_id = default_run_id(cfg, backend=plan.backend, world_size=plan.replicas)
            cfg.run_id = run_id + (f"-r{k}" if rounds_id else "")
        if plan.reason is not None:
            if args.mode != "all" and not args.skip_impossible:
                raise LaunchError(plan.reason)
            if k == 0:  # impossible here (or with this batch): recorded as skipped, once
                _skip(cfg, plan, workload)
            results.append(ModeResult(label, "skipped", None))
            continue
        if plan.backend != "none":
            cfg.backend = plan.backend  # every rank uses what was planned, not "auto" again
        if mode == "dp":  # the planned GPUs must reach train, which otherwise takes every GPU
            cfg.dp_gpus = plan.replicas or 0
        status = _execute(cfg, plan, args, extra, workload)
        results.append(ModeResult(label, status, Path(cfg.runs_dir) / cfg.run_id))
        if status == "interrupted":
            break  # the user stopped the job: start no further mode
    return results


def run(args: argparse.Namespace, extra: list[str]) -> int:
    """Plan, validate and execute the requested run(s); return the process exit code."""
    _absolute_paths(args)
    _check_arguments(args)
    # Every TrainConfig check (profiler schedule included) before anything is created, then the
    # workload's: each factory imported, called and its result checked (one line each, exit 2).
    workload = check_workload(
        config_from_namespace(args, mode="single", backend=args.backend, init_method="")
    )
    init_method = ""
    if args.rdzv_file:
        path = Path(args.rdzv_file)
        if args.nnodes == 1:
            path.unlink(missing_ok=True)  # a file left by an earlier run would break the rendezvous
        path.parent.mkdir(parents=True, exist_ok=True)
        init_method = path.as_uri()  # file:///... (file:///C:/... on Windows)
    if extra:
        print(f"workloads.launch: passing to workloads.train: {' '.join(extra)}", file=sys.stderr)
    env = Environment.detect()
    rounds_id = repeat_id(args)

    def one_round(k: int) -> list[ModeResult]:
        return _one_round(args, extra, workload, env, init_method, (rounds_id, k))

    statuses = run_rounds(args, one_round)
    if args.node_rank == 0:
        print("\n" + "\n".join(next_lines(args.runs_dir)))
    if "interrupted" in statuses:
        return 130
    return 1 if "failed" in statuses else 0


def build_parser(prog: str = "python -m workloads.launch") -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Profile the same training as single-device, DataParallel and DDP runs; one "
        "run folder per run under --runs-dir.",
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
    add_repeat_arguments(parser)
    script = parser.add_argument_group("your own training script (docs/guides/own-script.md)")
    script.add_argument(
        "--script",
        default="",
        help="profile this unedited training script instead of dpscope's own training; its "
        "arguments go after `--` (--mode single|ddp; --max-steps N stops it after N optimizer "
        "steps; the built-in training's options, --model, --epochs, --batch-size, ..., are "
        "refused)",
    )
    script.add_argument(
        "--samples-per-step",
        type=int,
        default=None,
        help="--script: samples per optimizer step and rank (default: the leading dimension of "
        "the model's first input, summed over the step's forwards)",
    )
    script.add_argument(
        "--workload",
        default="",
        help="--script: the name that pairs runs for speedup (default: the script's hash and "
        "arguments)",
    )
    add_config_arguments(parser, exclude=("mode", "backend", "init_method"))
    return parser


def _script_main(parser: argparse.ArgumentParser, argv: list[str], prog: str) -> int:
    """`--script PATH ... -- SCRIPT_ARGS`: everything after the first `--` is the script's."""
    cut = argv.index("--") if "--" in argv else len(argv)
    ours, script_args = argv[:cut], argv[cut + 1 :]

    def body() -> int:
        try:
            return run_script(parse_script_args(parser, ours), script_args)
        except (ScriptError, ValueError) as exc:
            raise LaunchError(str(exc)) from None

    return run_command(prog, body)


def main(argv: list[str] | None = None, *, prog: str = "python -m workloads.launch") -> int:
    parser = build_parser(prog)
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    if any(a == "--script" or a.startswith("--script=") for a in argv[:cut]):
        return _script_main(parser, argv, prog)
    # An unknown option is one line here, before any run folder exists (it used to reach the
    # trainer, which failed after the launcher had written a `failed` run folder).
    args = parser.parse_args(argv)
    if args.samples_per_step is not None or args.workload:
        parser.error("--samples-per-step and --workload need --script")

    def body() -> int:
        try:
            return run(args, [])
        except ValueError as exc:  # TrainConfig's checks: the message names the flag and the fix
            raise LaunchError(str(exc)) from None

    return run_command(prog, body)


if __name__ == "__main__":
    sys.exit(main())
