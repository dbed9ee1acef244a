"""`python -m workloads.launch --script PATH --mode single|ddp [--nproc N] [...] -- SCRIPT_ARGS`:
profile an unedited training script (docs/guides/own-script.md).

The launcher checks the arguments (one line each, nothing written), writes run.json `running`,
starts workloads.launch.bootstrap (under torchrun for `--mode ddp`, which sets RANK, WORLD_SIZE,
LOCAL_RANK and MASTER_* as any torchrun script expects) under the same supervision as built-in
runs, then assembles the ranks' parts (profiler.runfolder.parts) into steps.csv and run.json. A failed
script becomes `status: failed` through runlog.finalize, as a built-in run does.

run.json `config` adds `script` (absolute path), `script_args`, `script_sha256` and `workload`:
`--workload NAME`, else `script:<first 16 hex of the sha256>` plus the arguments, the
same-workload key analysis pairs single and DDP runs of one script with.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

from profiler.environment import collect_env
from profiler.runfolder.layout import create_run_folder, utc_now, write_run_json
from profiler.runfolder.lease import Lease
from profiler.runfolder.versions import RUN_JSON_SCHEMA_VERSION
from profiler.session import ProfileConfig
from workloads.config import PROCESS_GROUP_MODES, TrainConfig, config_from_namespace
from workloads.launch.bootstrap import SETTINGS_ENV
from workloads.launch.child import child_env, user_path
from workloads.launch.flightrec import flight_recorder_env
from workloads.launch.scriptend import end_script_run, exit_code, next_lines, print_summary
from workloads.launch.supervise import WATCHDOG_GRACE_S, run_supervised

__all__ = ["ScriptError", "next_lines", "parse_script_args", "run_script"]

BUILTIN_ONLY = ("--model", "--dataset")
SCRIPT_OPTIONS = frozenset(
    {
        "help", "mode", "nproc", "script", "samples_per_step", "workload", "runs_dir", "run_id",
        "warmup_steps", "max_steps", "profile", "profile_wait", "profile_warmup",
        "profile_active", "profile_repeat", "profile_with_stack", "collective_timeout",
    }
)  # fmt: skip
"""The launcher options that mean something with --script; every other one is refused."""
HINTS = {
    "epochs": "the script decides how long it trains (--max-steps N caps it)",
    "batch_size": "the script builds its own DataLoader",
    "threads": "the script may call torch.set_num_threads; dpscope sets OMP_NUM_THREADS to "
    "cores ÷ processes",
    "backend": "the script passes its backend to init_process_group",
    "init_method": "the script passes its own to init_process_group",
    "nnodes": "--script runs on one node (torchrun --standalone)",
    "zero": "the script builds its own optimizer; dpscope records a ZeroRedundancyOptimizer it "
    "sees (config.zero)",
    "fsdp_wrap": "the script calls fully_shard itself; dpscope records the sharding it sees",
    "fsdp_reshard_after_forward": "the script passes its own to fully_shard",
}
SCRIPT_STALL_S = 24 * 3600.0
"""A single-process script writes no heartbeat: the watchdog only ends it after a day. A DDP or
FSDP script's ranks beat (workloads.launch.flightrec): --collective-timeout + WATCHDOG_GRACE_S."""
_UNSET = object()


class ScriptError(Exception):
    """A `--script` argument that cannot work; the message is one line that says what to do."""


def _refusal(flag: str, dest: str) -> str:
    if flag in BUILTIN_ONLY:
        return (
            f"{flag} picks dpscope's built-in training, but --script runs your own; drop "
            f"{flag} (the script builds its model and data)"
        )
    hint = HINTS.get(dest, "it belongs to dpscope's built-in training")
    return (
        f"{flag} does nothing with --script ({hint}); drop it, or pass the script's own "
        "option after `--`"
    )


def parse_script_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The launcher's options of a `--script` run; ScriptError naming the first option given
    that does not apply to a script (abbreviations and `--flag=value` included), with its fix."""
    others = [a for a in parser._actions if a.dest not in SCRIPT_OPTIONS and a.option_strings]
    defaults = {a.dest: a.default for a in others}
    parser.set_defaults(**dict.fromkeys(defaults, _UNSET))
    try:
        args = parser.parse_args(argv)
    finally:
        parser.set_defaults(**defaults)
    for action in others:
        if getattr(args, action.dest) is not _UNSET:
            raise ScriptError(_refusal(_typed(argv, action.option_strings), action.dest))
        setattr(args, action.dest, defaults[action.dest])
    return args


def _typed(argv: list[str], names: list[str]) -> str:
    """The option as the user typed it (`--no-x`, an abbreviation), else its first name."""
    for token in argv:
        flag = token.split("=", 1)[0]
        if flag.startswith("--") and any(n.startswith(flag) for n in names):
            return flag
    return names[0]


def workload_name(sha256: str, args: list[str], given: str) -> str:
    """The same-workload key of a script run (see the module docstring)."""
    return given or " ".join([f"script:{sha256[:16]}", *map(shlex.quote, args)])


def _config_extra(script: Path, args: list[str], sha: str, workload: str, max_steps: int) -> dict:
    return {
        "max_steps": max_steps or None,
        "script": str(script),
        "script_args": args,
        "script_sha256": sha,
        "workload": workload,
    }


def _check(args: argparse.Namespace) -> Path:
    script = user_path(args.script)
    if not script.is_file():
        raise ScriptError(
            f"--script {args.script}: no such file; pass the path of your training script"
        )
    if args.mode not in ("single", "ddp", "fsdp"):
        raise ScriptError(
            f"--script runs with --mode single, ddp or fsdp, not {args.mode}; a script that "
            "builds nn.DataParallel itself is recorded as dp under --mode single"
        )
    if args.nproc is not None and args.nproc < 1:
        raise ScriptError(f"--nproc must be >= 1; got {args.nproc}")
    if args.samples_per_step is not None and args.samples_per_step < 1:
        raise ScriptError(f"--samples-per-step must be >= 1; got {args.samples_per_step}")
    return script


def _command(script: Path, script_args: list[str], mode: str, nproc: int) -> list[str]:
    boot = ["-m", "workloads.launch.bootstrap", str(script), *script_args]
    if mode == "single":
        return [sys.executable, *boot]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(nproc), *boot]  # fmt: skip


def _env(cfg: TrainConfig, run_dir: Path, args: argparse.Namespace, nproc: int) -> dict:
    settings = {
        "run_dir": str(run_dir),
        "profile": ProfileConfig(**cfg.profile_kwargs()).to_dict(),
        "warmup_steps": cfg.warmup_steps,
        "samples_per_step": args.samples_per_step,
        "workload": args.workload_name,
        "max_steps": cfg.max_steps,
        "collective_timeout": cfg.collective_timeout,
    }
    env = child_env(PYTHONUNBUFFERED="1", **{SETTINGS_ENV: json.dumps(settings)})
    if args.mode in PROCESS_GROUP_MODES:  # the script picks its backend: NCCL's dump too
        env = {**flight_recorder_env(run_dir / "logs", nccl=True), **env}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env.setdefault("KINETO_LOG_LEVEL", "5")
    return env


def _running_record(cfg: TrainConfig, mode: str, nproc: int, extra: dict) -> dict:
    config = {
        "mode": mode,
        "world_size": nproc if mode in PROCESS_GROUP_MODES else 1,
        "profile": ProfileConfig(**cfg.profile_kwargs()).to_dict(),
        "warmup_steps": cfg.warmup_steps,
        **extra,
    }
    return {
        "schema_version": RUN_JSON_SCHEMA_VERSION,
        "run_id": cfg.run_id,
        "status": "running",
        "error": None,
        "created_at": utc_now(),
        "finished_at": None,
        "config": config,
        "env": collect_env(threads_per_rank=None),
        "metrics": {},
        "eval": {"epochs": [], "best": None},
        "traces": [],
    }


def run_script(args: argparse.Namespace, script_args: list[str]) -> int:
    """Profile the script once; return dpscope's exit code (workloads.launch.scriptend: 0 ok,
    the first failing rank's exit code, 130 / 143 when SIGINT / SIGTERM stopped it)."""
    script = _check(args)
    args.runs_dir = str(user_path(args.runs_dir))
    cfg = config_from_namespace(args, mode="single", backend="auto", init_method="")
    mode = args.mode
    nproc = (args.nproc or 2) if mode in PROCESS_GROUP_MODES else 1
    sha = hashlib.sha256(script.read_bytes()).hexdigest()
    args.workload_name = workload_name(sha, script_args, args.workload)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    cfg.run_id = cfg.run_id or f"script-{script.stem}-{mode}-n{nproc}-{stamp}"
    run_dir = create_run_folder(cfg.runs_dir, cfg.run_id, writer="launcher")  # exclusive
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    lease = Lease(run_dir, "launcher")  # a killed launcher reads as such (profiler.runfolder.lease)
    extra = _config_extra(script, script_args, sha, args.workload_name, cfg.max_steps)
    record = _running_record(cfg, mode, nproc, extra)
    write_run_json(run_dir, record)
    launcher_log = run_dir / "logs" / "launcher.log"
    outcome = run_supervised(
        _command(script, script_args, mode, nproc),
        env=_env(cfg, run_dir, args, nproc),
        log_path=launcher_log,
        logs=run_dir / "logs",
        stall_s=(
            cfg.collective_timeout + WATCHDOG_GRACE_S
            if mode in PROCESS_GROUP_MODES
            else SCRIPT_STALL_S
        ),
    )
    lease.stop()
    final = end_script_run(
        run_dir,
        outcome,
        expected=nproc,
        launcher_log=launcher_log,
        run_id=cfg.run_id,
        profile=record["config"]["profile"],
        warmup_steps=cfg.warmup_steps,
        config_extra=extra,
        created_at=record["created_at"],
    )
    print_summary(final, run_dir, args.runs_dir)
    return exit_code(final)
