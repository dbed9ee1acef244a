"""`python -m analysis project RUN --comm COMM_RUN --ranks 2,4,8`: the projection table and JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis.cli.table import say
from analysis.project.sharded import project_any
from profiler.runfolder.errors import InputError

__all__ = ["add_parser", "print_projection", "run"]


def _ranks(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise InputError(
            "--ranks", f"{text!r} is not a comma list of integers", "e.g. --ranks 2,4,8,64"
        ) from None


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the `project` subcommand on the analysis CLI."""
    p = sub.add_parser("project", help="project a run's step time to other world sizes")
    p.add_argument(
        "run", type=Path, metavar="RUN", help="single-device, DDP, ZeRO-1 or FSDP2 run folder"
    )
    p.add_argument(
        "--comm", type=Path, required=True, metavar="COMM_RUN", help="make bench-comm run"
    )
    p.add_argument("--ranks", default="1,2,4,8,16,32,64", help="world sizes, e.g. 2,4,8,64,1024")
    p.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (default 8)")
    p.add_argument(
        "--inter-node", default="100", help="link between nodes: preset 25|100|200|400 or Gb/s"
    )
    p.add_argument("--scaling", choices=("strong", "weak"), default=None, help="default: RUN's")
    p.add_argument("--backend", choices=("nccl", "gloo"), default=None, help="default: RUN's")
    p.add_argument(
        "--measured",
        type=Path,
        nargs="*",
        default=[],
        help="runs of RUN's mode at other world sizes to compare against",
    )
    p.add_argument(
        "--batch-runs",
        type=Path,
        nargs="*",
        default=[],
        help="single-device runs at other per-device batches (used instead of linear scaling)",
    )
    p.add_argument(
        "--bandwidth",
        choices=("measured", "fit"),
        default="measured",
        help="bus bandwidth per message size as benchmarked (default) or the single α–β fit",
    )
    p.add_argument("--no-traces", action="store_true", help="do not read a DDP RUN's traces")
    return p


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def print_projection(result: dict) -> None:
    """The per-n table, the replay and measured checks, assumptions and warnings."""
    inp = result["inputs"]
    # ZeRO-1 and FSDP2: each collective with the model of the algorithm that moves its bytes
    models = {f"{c} (as {inp['algorithms'][c]})": m for c, m in inp.get("comm_models", {}).items()}
    models = models or {"all_reduce": inp["all_reduce_model"]}
    fits = "; ".join(
        f"{name} α = {m['alpha_us']:.2f} µs/step, B = {m['bus_gbps']:.3f} GB/s (fit error mean "
        f"{m['fit_error_pct_mean']:.1f}%)"
        for name, m in models.items()
    )
    say(
        f"projection of {result['run_id']} ({inp['mode']}, n={inp['world_size']}, "
        f"{result['scaling']} scaling, backend {result['backend']}) with comm run "
        f"{result['comm_run_id']}: {fits}"
    )
    say(
        f"{'n':>6} {'batch/dev':>10} {'step ms':>10} {'compute ms':>11} {'comm ms':>9} "
        f"{'straggler ms':>13} {'exposed ms':>11} {'exposed %':>10} {'samples/s':>11} {'speedup ×':>10} {'efficiency %':>13}"
    )
    for p in result["predictions"]:
        say(
            f"{p['ranks']:>6} {p['per_device_batch']:>10.4g} {p['step_time_s'] * 1e3:>10.2f} "
            f"{p['compute_s'] * 1e3:>11.2f} {p['comm_s'] * 1e3:>9.2f} "
            f"{p['straggler_s'] * 1e3:>13.2f} {p['exposed_comm_s'] * 1e3:>11.2f} "
            f"{p['exposed_comm_pct']:>10.1f} "
            f"{p['samples_per_s']:>11,.1f} {p['speedup']:>10.2f} {100 * p['scaling_efficiency']:>13.1f}"
        )
    r = result["replay"]
    say(
        f"replay at n={r['ranks']}: measured {_f(r['measured_step_time_s'] * 1e3)} ms, "
        f"projected {_f(r['predicted_step_time_s'] * 1e3)} ms, error {r['error_pct']:+.1f}%"
        + (f" ({r['note']})" if r["note"] else "")
    )
    for c in result["measured"]:
        say(
            f"measured {c['run_id']} at n={c['ranks']}: {_f(c['measured_step_time_s'] * 1e3)} ms, "
            f"projected {_f(c['predicted_step_time_s'] * 1e3)} ms, error {c['error_pct']:+.1f}%"
            + (f" ({c['note']})" if c["note"] else "")
        )
    say("assumptions:")
    for a in result["assumptions"]:
        say(f"  - {a}")
    for w in result["warnings"]:
        say(f"warning: {w}")


def run(args: argparse.Namespace) -> dict:
    """Compute the projection for parsed `project` arguments."""
    return project_any(
        args.run,
        args.comm,
        _ranks(args.ranks),
        gpus_per_node=args.gpus_per_node,
        inter_node=args.inter_node,
        scaling=args.scaling,
        backend=args.backend,
        measured=args.measured,
        batch_runs=args.batch_runs,
        traces=not args.no_traces,
        bandwidth=args.bandwidth,
    )
