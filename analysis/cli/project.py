"""`python -m analysis project RUN --comm COMM_RUN --ranks 2,4,8`: the projection table and JSON."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from analysis.cli.table import say
from analysis.project.bands import band_text
from analysis.project.sharded import project_any
from profiler.runfolder.errors import InputError

__all__ = ["add_parser", "headline", "print_projection", "ranks_list", "run"]


def ranks_list(text: str) -> list[int]:
    """--ranks: integers separated by commas and/or spaces ("2,4,8" or "2 4 8", as the make
    variables' lists are written; spaces were once dropped, which read "2 4 8" as 248)."""
    try:
        return [int(t) for t in re.split(r"[,\s]+", text.strip()) if t]
    except ValueError:
        raise InputError(
            "--ranks", f"{text!r} is not a list of integers", "e.g. --ranks 2,4,8,64"
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
    p.add_argument(
        "--ranks",
        default="1,2,4,8,16,32,64",
        help="world sizes, commas or spaces between, e.g. 2,4,8,64,1024",
    )
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
        "--workload-runs",
        type=Path,
        nargs="*",
        default=[],
        help="other runs of RUN's workload: other seeds (RUN's mode and n) widen the compute band; "
        "a 1-rank DDP run gives a single-device RUN its compute at n >= 2 (DDP's own cost)",
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


def _ms(p: dict, key: str = "step_time_s") -> str:
    """A step time in ms with its band, e.g. `12.30 (11.02–14.10)`."""
    return band_text(1e3 * p[key], 1e3 * p[f"{key}_low"], 1e3 * p[f"{key}_high"])


def headline(p: dict) -> str:
    """One prediction in words with its band: "1.70× (1.52–1.88×) at 8 ranks, ..."."""
    eff = 100 * p["scaling_efficiency"], 100 * p["scaling_efficiency_low"]
    return (
        f"{band_text(p['speedup'], p['speedup_low'], p['speedup_high'], unit='×')} at "
        f"{p['ranks']} rank{'s' if p['ranks'] != 1 else ''}, efficiency "
        f"{band_text(eff[0], eff[1], 100 * p['scaling_efficiency_high'], '{:.0f}', '%')}, "
        f"step {_ms(p)} ms"
    )


def _sources(p: dict) -> str:
    """The band's sources of one prediction, e.g. `compute ×0.91–×1.14 (p5–p95 of ...)`."""
    out = []
    for s in p["band_sources"]:
        if s["unit"] == "s":
            out.append(f"{s['term']} {1e3 * s['low']:.2f}–{1e3 * s['high']:.2f} ms ({s['source']})")
        else:
            out.append(f"{s['term']} ×{s['low']:.3f}–×{s['high']:.3f} ({s['source']})")
    return "; ".join(out)


def _check_line(what: str, c: dict) -> str:
    band = band_text(1e3 * c["predicted_step_time_s"], 1e3 * c["predicted_step_time_s_low"],
                     1e3 * c["predicted_step_time_s_high"])  # fmt: skip
    return (
        f"{what} at n={c['ranks']}: measured {_f(c['measured_step_time_s'] * 1e3)} ms, "
        f"projected {band} ms ({'inside' if c['in_band'] else 'outside'} the band), error "
        f"{c['error_pct']:+.1f}%" + (f" ({c['note']})" if c["note"] else "")
    )


def print_projection(result: dict) -> None:
    """The per-n table (every prediction with its band), the replay and measured checks, the
    self-replay, the band's sources, assumptions and warnings."""
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
        f"{result['comm_run_id']}: {fits}; bands: every measured spread at its low and high end"
    )
    say(
        f"{'n':>6} {'batch/dev':>10} {'step ms (band)':>26} {'compute ms':>11} {'comm ms':>9} "
        f"{'straggler ms':>13} {'exposed %':>10} {'samples/s':>11} {'speedup × (band)':>20} "
        f"{'efficiency % (band)':>20}"
    )
    for p in result["predictions"]:
        eff = [100 * p[k] for k in ("scaling_efficiency", "scaling_efficiency_low",
                                    "scaling_efficiency_high")]  # fmt: skip
        say(
            f"{p['ranks']:>6} {p['per_device_batch']:>10.4g} {_ms(p):>26} "
            f"{p['compute_s'] * 1e3:>11.2f} {p['comm_s'] * 1e3:>9.2f} "
            f"{p['straggler_s'] * 1e3:>13.2f} {p['exposed_comm_pct']:>10.1f} "
            f"{p['samples_per_s']:>11,.1f} "
            f"{band_text(p['speedup'], p['speedup_low'], p['speedup_high']):>20} "
            f"{band_text(*eff, '{:.1f}'):>20}"
        )
    for p in result["predictions"]:
        say(f"  {headline(p)}; band from {_sources(p)}")
    say(_check_line("replay", result["replay"]))
    t = result.get("replay_traced")
    if t:
        say(
            f"self-replay at n={t['ranks']} (its own traced per-bucket comm over "
            f"{t['traced_steps']} steps): measured {_f(t['measured_step_time_s'] * 1e3)} ms, "
            f"projected {_f(t['predicted_step_time_s'] * 1e3)} ms, error {t['error_pct']:+.1f}%"
        )
    for c in result["measured"]:
        say(_check_line(f"measured {c['run_id']}", c))
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
        ranks_list(args.ranks),
        gpus_per_node=args.gpus_per_node,
        inter_node=args.inter_node,
        scaling=args.scaling,
        backend=args.backend,
        measured=args.measured,
        batch_runs=args.batch_runs,
        workload_runs=args.workload_runs,
        traces=not args.no_traces,
        bandwidth=args.bandwidth,
    )
