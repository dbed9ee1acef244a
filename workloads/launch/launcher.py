"""The launcher behind `make profile-*`: `python -m workloads.launch --mode single|dp|ddp|fsdp|all`.

It checks what this machine can run (one clear line and exit code 2 otherwise), writes
`run.json` with status `running` and the config, starts the training — `workloads.train` directly
for single/DP, through torchrun (`python -m torch.distributed.run`) for DDP and FSDP — relays its output to
the console and `logs/launcher.log`, and afterwards turns a crash into `status: failed` with the
failing rank, its exit code and the last lines of its log. `--mode all` runs every mode this
machine supports and records the others as `status: skipped` with the reason. The training runs
under workloads.launch.supervise: a heartbeat watchdog ends a hung job, Ctrl-C/SIGTERM stops every
process, and runlog.finalize gives each failed run its `error.kind` (never downgrading `ok`).

Every run it will make is planned and checked first (options, workload, batch against the
dataset, for every mode of `--mode all`): nothing is written before all pass. Each run folder is
then claimed exclusively (profiler.runfolder.layout.create_run_folder: of two launchers given the same
--run-id, one runs and the other gets one line; a default id that is taken gets a `-2` suffix)
and leased while the training runs (profiler.runfolder.lease), so a launcher killed by SIGKILL leaves a run
that readers see as `failed (launcher killed)`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from profiler.environment import collect_env
from profiler.runfolder.errors import disk_writes, run_command
from profiler.runfolder.layout import RUN_JSON, RunFolderTaken, create_run_folder, write_run_json
from profiler.runfolder.lease import Lease
from profiler.runfolder.schema import ErrorInfo, RunRecord, Status
from workloads.config import (
    PROCESS_GROUP_MODES,
    TrainConfig,
    config_from_namespace,
    default_run_id,
    to_argv,
)
from workloads.launch.child import child_env
from workloads.launch.flightrec import flight_recorder_env
from workloads.launch.options import LaunchError, absolute_paths, build_parser, check_arguments
from workloads.launch.rounds import ModeResult, repeat_id, run_rounds
from workloads.launch.runlog import finalize
from workloads.launch.script import ScriptError, next_lines, parse_script_args, run_script
from workloads.launch.supervise import WATCHDOG_GRACE_S, run_supervised
from workloads.plan import Environment, Plan, check_machine
from workloads.plan import plan as plan_run
from workloads.runrecord import device_type, run_record
from workloads.train.workload import WorkloadFacts, check_workload

__all__ = ["LaunchError", "build_parser", "claim_run_dir", "main"]

ALL_MODES = (("single", "auto"), ("dp", "auto"), ("ddp", "nccl"), ("ddp", "gloo"))


def _record(
    cfg: TrainConfig,
    plan: Plan,
    workload: WorkloadFacts,
    *,
    status: Status,
    error: ErrorInfo | None = None,
) -> RunRecord:
    """The launcher's run record: `running` before the training starts, or `skipped`."""
    env = collect_env(threads_per_rank=plan.threads_per_rank, device_type=device_type(plan))
    return run_record(cfg, plan, status=status, env=env, error=error, workload=workload)


def _command(cfg: TrainConfig, plan: Plan, args: argparse.Namespace, extra: list[str]) -> list[str]:
    train_argv = [*to_argv(cfg), *extra]
    if plan.mode not in PROCESS_GROUP_MODES:
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


def claim_run_dir(cfg: TrainConfig, *, given: bool) -> Path:
    """Create and claim the run folder (exclusive); a default id that another run holds gets
    the next free `-<k>` suffix (cfg.run_id is updated), a given one is refused."""
    base = cfg.run_id
    for k in range(2, 1000):
        try:
            return create_run_folder(cfg.runs_dir, cfg.run_id, writer="launcher")
        except RunFolderTaken:
            if given:
                raise
            cfg.run_id = f"{base}-{k}"
    raise LaunchError(f"--runs-dir {cfg.runs_dir}: 1000 runs named {base}-*; pass --run-id")


def _rendezvous(cfg: TrainConfig, args: argparse.Namespace, run_dir: Path) -> None:
    """The file:// rendezvous of a DDP run: a fresh file dpscope creates in the run folder, or
    the given --rdzv-file (checked absent before anything started); its folder is made here."""
    if cfg.mode not in PROCESS_GROUP_MODES or not (args.file_rendezvous or args.rdzv_file):
        return
    path = run_dir / "logs" / "rendezvous" if args.file_rendezvous else Path(args.rdzv_file)
    with disk_writes(path.parent):
        path.parent.mkdir(parents=True, exist_ok=True)
    cfg.init_method = path.as_uri()  # file:///... (file:///C:/... on Windows)


def _env(plan: Plan, run_dir: Path) -> dict:
    env = child_env(PYTHONUNBUFFERED="1")
    if not plan.use_cuda:
        # What train sets anyway; it also silences torchrun's OMP_NUM_THREADS note.
        env["OMP_NUM_THREADS"] = str(plan.threads_per_rank)
        # A CUDA build of torch on a machine without a GPU makes Kineto log a harmless
        # "ERROR ... gpuGetDeviceCount failed" at every trace; level 5 keeps CPU logs clean.
        env.setdefault("KINETO_LOG_LEVEL", "5")
    if plan.mode in PROCESS_GROUP_MODES:  # the flight recorder (workloads.launch.flightrec)
        env = {**flight_recorder_env(run_dir / "logs", nccl=plan.backend == "nccl"), **env}
    return env


def _execute(
    cfg: TrainConfig,
    plan: Plan,
    args: argparse.Namespace,
    extra: list[str],
    workload: WorkloadFacts,
) -> str:
    """Run one planned training; return its final status."""
    is_record_node = args.node_rank == 0
    lease = None
    if is_record_node:
        run_dir = claim_run_dir(cfg, given=bool(args.run_id))
        write_run_json(run_dir, _record(cfg, plan, workload, status="running"))
        lease = Lease(run_dir, "launcher")
    else:
        run_dir = Path(cfg.runs_dir) / cfg.run_id
    with disk_writes(run_dir / "logs"):
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    _rendezvous(cfg, args, run_dir)
    log_name = "launcher.log" if is_record_node else f"launcher-node{args.node_rank}.log"
    launcher_log = run_dir / "logs" / log_name
    try:
        outcome = run_supervised(
            _command(cfg, plan, args, extra),
            env=_env(plan, run_dir),
            log_path=launcher_log,
            logs=run_dir / "logs",
            stall_s=cfg.collective_timeout + WATCHDOG_GRACE_S,
        )
    finally:
        if lease is not None:
            lease.stop()
    returncode = outcome.returncode
    if not is_record_node:
        print(
            f"node {args.node_rank} finished (exit code {returncode}); node 0 writes {run_dir / RUN_JSON}"
        )
        return "ok" if returncode == 0 else "failed"
    record = finalize(run_dir, outcome, launcher_log)
    print(f"\nrun folder: {run_dir}  status: {record.status}")
    if record.status == "failed" and record.error:
        print(f"  error ({record.error.kind}): {record.error.message}\n  logs:  {run_dir / 'logs'}")
    return "interrupted" if outcome.interrupted and record.status != "ok" else record.status


def _skip(cfg: TrainConfig, plan: Plan, workload: WorkloadFacts, *, given: bool) -> None:
    run_dir = claim_run_dir(cfg, given=given)
    error = ErrorInfo.written(message=plan.reason, rank=None, exit_code=None, log_tail=[])
    write_run_json(run_dir, _record(cfg, plan, workload, status="skipped", error=error))
    print(f"\nrun folder: {run_dir}  status: skipped ({plan.reason})")


def _check_batch(cfg: TrainConfig, plan: Plan, workload: WorkloadFacts) -> None:
    """The planned global batch must fit in the training split (else no step could run)."""
    if plan.global_batch is not None and plan.global_batch > workload.train_samples:
        scaled = f" (--scaling weak: {cfg.batch_size} × {plan.replicas})" * (cfg.scaling == "weak")
        raise LaunchError(
            f"--batch-size {cfg.batch_size}: the global batch of --mode {cfg.mode} is "
            f"{plan.global_batch}{scaled}, more than the {workload.train_samples} samples of "
            f"--dataset {cfg.dataset}'s training split; lower --batch-size"
        )


def _plan_all(
    args: argparse.Namespace, workload: WorkloadFacts, rounds: tuple[str, int] = ("", 0)
) -> list[tuple[TrainConfig, Plan]]:
    """Every run this command makes (in one round of `--repeat`: `rounds` is its id and the
    round, ("", 0) outside rounds), planned and checked before any is started or written."""
    env = Environment.detect()
    init_method = Path(args.rdzv_file).as_uri() if args.rdzv_file else ""
    (rounds_id, k), jobs = rounds, []
    for mode, backend in ALL_MODES if args.mode == "all" else ((args.mode, args.backend),):
        # DP's GPU count is --nproc (as `make profile-all NPROC=` passes it) or --dp-gpus.
        dp_gpus = (args.nproc or args.dp_gpus) if mode == "dp" else args.dp_gpus
        cfg = config_from_namespace(args, mode=mode, backend=backend, init_method=init_method,
                                    dp_gpus=dp_gpus, repeat_id=rounds_id, repeat_round=k)  # fmt: skip
        plan = plan_run(cfg, env, nproc=args.nproc, nnodes=args.nnodes)
        for warning in plan.warnings if k == 0 else ():
            print(f"workloads.launch: warning: {warning}", file=sys.stderr)
        if not cfg.run_id:
            run_id = default_run_id(cfg, backend=plan.backend, world_size=plan.replicas)
            cfg.run_id = run_id + (f"-r{k}" if rounds_id else "")
        if plan.reason is not None and args.mode != "all" and not args.skip_impossible:
            raise LaunchError(plan.reason)
        _check_batch(cfg, plan, workload)
        if plan.reason is None and plan.backend != "none":
            cfg.backend = plan.backend  # every rank uses what was planned, not "auto" again
        if plan.reason is None and mode == "dp":  # else train would take every GPU
            cfg.dp_gpus = plan.replicas or 0
        jobs.append((cfg, plan))
    return jobs


def _run_jobs(
    jobs: list[tuple[TrainConfig, Plan]],
    args: argparse.Namespace,
    extra: list[str],
    workload: WorkloadFacts,
    *,
    first: bool,
) -> list[ModeResult]:
    """Execute the planned runs in turn; a mode this machine can't run is recorded as skipped in
    the `first` round only. Stops at an interrupted run."""
    results = []
    for cfg, plan in jobs:
        label = f"ddp-{plan.backend}" if cfg.mode == "ddp" else cfg.mode
        if plan.reason is not None:  # impossible here (or with this batch): recorded as skipped
            if first:
                _skip(cfg, plan, workload, given=bool(args.run_id))
            results.append(ModeResult(label, "skipped", None))
            continue
        status = _execute(cfg, plan, args, extra, workload)
        results.append(ModeResult(label, status, Path(cfg.runs_dir) / cfg.run_id))
        if status == "interrupted":
            break  # the user stopped the job: start no further mode
    return results


def run(args: argparse.Namespace, extra: list[str]) -> int:
    """Plan, validate and execute the requested run(s); return the process exit code."""
    absolute_paths(args)
    check_arguments(args)
    # Every TrainConfig check (profiler schedule included) before anything is created, then the
    # workload's: each factory imported, called and its result checked (one line each, exit 2).
    # The mode's own options (--zero, --fsdp-wrap) are checked with it: `all` checks as single.
    mode = "single" if args.mode == "all" else args.mode
    first = config_from_namespace(args, mode=mode, backend=args.backend, init_method="")
    check_machine(first, Environment.detect())  # --threads / --num-workers, before user code
    workload = check_workload(first)
    rounds_id = repeat_id(args)
    first_round = _plan_all(args, workload, (rounds_id, 0))
    if extra:
        print(f"workloads.launch: passing to workloads.train: {' '.join(extra)}", file=sys.stderr)

    def one_round(k: int) -> list[ModeResult]:
        jobs = first_round if k == 0 else _plan_all(args, workload, (rounds_id, k))
        return _run_jobs(jobs, args, extra, workload, first=k == 0)

    statuses = run_rounds(args, one_round)
    if args.node_rank == 0:
        print("\n" + "\n".join(next_lines(args.runs_dir)))
    if "interrupted" in statuses:
        return 130
    return 1 if "failed" in statuses else 0


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
