"""The command line of the launcher (`python -m workloads.launch`, `dpscope profile`): its
parser, and the launcher-only checks that need no run folder (one LaunchError line each, made
before anything is written). The training flags themselves come from TrainConfig
(workloads.config.add_config_arguments) and are checked when the config is built.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from profiler.runfolder.errors import UserError, disk_writes
from workloads.config import PROCESS_GROUP_MODES, OneLineParser, add_config_arguments
from workloads.launch.child import user_path
from workloads.launch.rounds import add_repeat_arguments, check_repeat

__all__ = ["LaunchError", "absolute_paths", "build_parser", "check_arguments"]


class LaunchError(UserError):
    """What the user asked for cannot run here; the message is one line that says what to do."""


def check_arguments(args: argparse.Namespace) -> None:
    """Launcher-only arguments that are wrong on any machine: one line each, nothing written."""
    if args.mode == "all" and args.run_id:
        raise LaunchError("--run-id names one run but --mode all makes four; leave --run-id out")
    if args.mode == "all" and (args.zero or args.fsdp_wrap):
        flag = "--zero" if args.zero else "--fsdp-wrap"
        raise LaunchError(
            f"{flag} belongs to one mode but --mode all runs single, dp and ddp without it; "
            f"run that mode on its own (--mode {'ddp' if args.zero else 'fsdp'})"
        )
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
    if args.max_restarts and args.mode not in PROCESS_GROUP_MODES:
        raise LaunchError(
            "--max-restarts restarts torchrun's workers, so it needs --mode ddp or fsdp "
            "(run single-device as --mode ddp --nproc 1 to get restarts)"
        )
    if args.nnodes > 1 and args.mode not in PROCESS_GROUP_MODES:
        raise LaunchError("--nnodes > 1 only makes sense with --mode ddp or fsdp")
    runs = Path(args.runs_dir)
    with disk_writes(runs):  # a name too long for the file system is one line too
        existing = next(p for p in (runs, *runs.parents) if p.exists())
    if not existing.is_dir():
        raise LaunchError(
            f"--runs-dir {runs}: {existing} is a file, not a folder; pass a folder (make: RUNS=DIR)"
        )
    _check_rendezvous(args)


def _check_rendezvous(args: argparse.Namespace) -> None:
    """--rdzv-file / --file-rendezvous: DDP only, never both, and a given file must not exist
    (one node: a file there is someone else's or an earlier run's, and dpscope deletes nothing
    it did not create)."""
    if not (args.rdzv_file or args.file_rendezvous):
        return
    flag = "--rdzv-file" if args.rdzv_file else "--file-rendezvous"
    if args.mode in ("single", "dp"):
        raise LaunchError(f"{flag} sets DDP's rendezvous; --mode {args.mode} has none: drop it")
    if args.rdzv_file and args.file_rendezvous:
        raise LaunchError(
            "--rdzv-file and --file-rendezvous both pick the rendezvous file; keep one"
        )
    if args.file_rendezvous and args.nnodes > 1:
        raise LaunchError(
            "--file-rendezvous puts the file in node 0's run folder, which other nodes cannot "
            "see; give --rdzv-file PATH on a file system every node shares"
        )
    path = Path(args.rdzv_file) if args.rdzv_file else None
    if path is not None and path.is_dir():
        raise LaunchError(f"--rdzv-file {path} is a folder; name a file that does not exist yet")
    if path is not None and args.nnodes == 1 and (path.exists() or path.is_symlink()):
        raise LaunchError(
            f"--rdzv-file {path} already exists (an earlier run's, or not dpscope's at all); "
            "dpscope never deletes a file it did not create: remove it yourself, pick a new "
            "path, or use --file-rendezvous"
        )


def absolute_paths(args: argparse.Namespace) -> None:
    """--runs-dir, --data-dir and --rdzv-file against the folder the user ran the command in,
    once, so that every child, record and message sees the same absolute path."""
    args.runs_dir = str(user_path(args.runs_dir))
    args.data_dir = str(user_path(args.data_dir))
    if args.rdzv_file:
        args.rdzv_file = str(user_path(args.rdzv_file))


def _add_script_arguments(parser: argparse.ArgumentParser) -> None:
    """--script and the options only a script run takes (workloads.launch.script)."""
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


def _add_rendezvous_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the ranks of a DDP/FSDP job meet: nodes, torchrun's rendezvous, file://."""
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
        help="ddp: file:// rendezvous on this path (every rank must reach it; it must not exist "
        "yet: dpscope never deletes a file it did not create); becomes init_method",
    )
    parser.add_argument(
        "--file-rendezvous",
        action="store_true",
        help="ddp: file:// rendezvous on a fresh file dpscope creates in the run folder "
        "(logs/rendezvous), e.g. where torchrun's TCP store fails (Windows); one node only",
    )


def build_parser(prog: str = "python -m workloads.launch") -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Profile the same training as single-device, DataParallel, DDP (ZeRO-1 with "
        "--zero 1) and FSDP2 runs; one run folder per run under --runs-dir.",
    )
    parser.add_argument(
        "--mode",
        choices=("single", "dp", "ddp", "fsdp", "all"),
        default="single",
        help="fsdp = FSDP2 (fully_shard, one process per device; ZeRO-1 is --mode ddp --zero 1); "
        "all = single, dp, ddp-nccl, ddp-gloo as this machine allows (others: skipped)",
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "nccl", "gloo"),
        default="auto",
        help="DDP/FSDP backend; auto = nccl on Linux with CUDA, gloo otherwise",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="DDP/FSDP processes per node (default: GPU count, 2 on CPU); DP: GPUs to use",
    )
    _add_rendezvous_arguments(parser)
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
    _add_script_arguments(parser)
    add_config_arguments(parser, exclude=("mode", "backend", "init_method"))
    return parser
