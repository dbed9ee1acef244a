"""What `make tune-ddp` prints and recommends: the terminal table and the command lines that
reproduce the workload with the best settings."""

from __future__ import annotations

import shlex
from pathlib import Path

import pandas as pd

__all__ = ["command_lines", "print_table", "table_rows"]


def command_lines(workload: dict, best_args: list[str]) -> tuple[str, str]:
    """(make line, launcher line) that run the tuned workload with `best_args` added to ARGS."""
    args = [*workload.get("args", []), *best_args]
    make = (
        f"make profile-ddp MODEL={workload['model']} DATASET={workload['dataset']} "
        f"BATCH={workload['batch_size']} NPROC={workload['nproc']} BACKEND={workload['backend']}"
    )
    if args:
        make += f" ARGS={shlex.quote(shlex.join(args))}"
    launcher = shlex.join(
        [
            "python",
            "-m",
            "workloads.launch",
            "--mode",
            "ddp",
            "--backend",
            workload["backend"],
            "--nproc",
            str(workload["nproc"]),
            "--model",
            workload["model"],
            "--dataset",
            workload["dataset"],
            "--batch-size",
            str(workload["batch_size"]),
            *args,
        ]
    )
    return make, launcher


def _num(v: float | None, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def table_rows(record: dict) -> list[dict]:
    """One row per arm (baseline first), the values the terminal table shows."""
    rows = []
    for arm in [record["baseline"], *record["candidates"]]:
        ok = [t for t in arm["trials"] if t["status"] == "ok"]
        lo, hi = arm.get("samples_per_s_min"), arm.get("samples_per_s_max")
        is_base = arm is record["baseline"]
        loss = arm.get("loss_max_abs_diff")
        rows.append(
            {
                "candidate": arm["name"],
                "status": arm["status"],
                "trials ok": f"{len(ok)}/{len(arm['trials'])}",
                "median samples/s": _num(arm.get("samples_per_s_median"), ".1f"),
                "range samples/s": "—" if lo is None else f"{lo:.1f}–{hi:.1f}",
                "speedup ×": "1 (ref)" if is_base else _num(arm.get("speedup_vs_baseline"), ".3f"),
                "p": "" if is_base else _num(arm.get("p_value"), ".3f"),
                "significant": "" if is_base else ("yes" if arm.get("significant") else "no"),
                "loss Δ": _num(loss, ".2e") + (" FLAG" if arm.get("loss_flagged") else ""),
                "note": "; ".join(n for n in (arm.get("reason"), arm.get("note")) if n),
            }
        )
    return rows


def print_table(record: dict, tune_dir: Path) -> None:
    """The terminal summary: the table, the rule, the best setting and where everything is."""
    rules = record["rules"]
    frame = pd.DataFrame(table_rows(record))
    with pd.option_context("display.max_colwidth", 60, "display.width", 200):
        print("\n" + frame.to_string(index=False))
    print(
        f"\nspeedup = median samples/s / the baseline's (interleaved trials); significant: "
        f"{rules['significance']}; loss Δ: {rules['loss']}, FLAG above {rules['loss_tolerance']} "
        f"(baseline row: its own trial-to-trial difference)."
    )
    if record["stopped_early"]:
        print(f"stopped early: {record['stop_reason']}")
    best = record["best"]
    if not any(t["status"] == "ok" for t in record["baseline"]["trials"]):
        print("best: none (no baseline trial finished, so nothing could be compared)")
    elif best:
        print(f"best: {best['name']} ({best['speedup_vs_baseline']:.3f}× the baseline)")
    else:
        print("best: keep the baseline settings (no knob was faster beyond the run-to-run noise)")
    print(f"command: {record['command']}\n         {record['launcher_command']}")
    print(f"tune folder: {tune_dir}  (tune.json; make report RUNS={tune_dir.parent} shows it)")
