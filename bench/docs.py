"""`make docs`: the generated pages, docs/reference/cli.md, run-folder.md's field tables and
docs/benchmarks.md.

- cli.md is built from the argparse parsers `dpscope` itself uses (workloads/tools/cli.py), one
  table per command, so it cannot drift from `--help`; tests/test_docs.py fails when it is stale.
- run-folder.md's field tables (between its two markers) are built from the run-folder Structs
  (bench/schemadocs.py); the prose around them is hand-written; tests/test_docs.py fails when
  the tables are stale.
- benchmarks.md is built from the `make bench-*` results in reports/bench/*.json, each with the
  date, commit and machine bench/common.py stamps into it. The JSONs are not committed (they
  belong to the machine that ran them); the page is, as the record of the last run.

    python -m bench.docs            # write both
    python -m bench.docs --check    # exit 1 if cli.md or the field tables are stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from bench.schemadocs import with_field_tables
from workloads.launch.child import PACKAGE_ROOT as REPO  # the clone: docs/ and reports/ are in it
from workloads.tools.cli import COMMANDS, build_parser, command_parser

__all__ = [
    "KEPT_HEADING",
    "RUN_FOLDER_MD",
    "bench_sections",
    "benchmarks_md",
    "cli_md",
    "kept_sections",
    "main",
]

CLI_MD = REPO / "docs" / "reference" / "cli.md"
RUN_FOLDER_MD = REPO / "docs" / "reference" / "run-folder.md"
BENCH_MD = REPO / "docs" / "benchmarks.md"
BENCH_DIR = REPO / "reports" / "bench"


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    value = action.default
    if action.nargs == 0 or isinstance(value, bool):  # a switch
        return "on" if value else "off"
    if value is None or value == "" or value == []:
        return "—"
    return f"`{value}`"


def _value(action: argparse.Action) -> str:
    if action.choices:
        return ", ".join(f"`{c}`" for c in action.choices)
    if action.nargs == 0:
        return ""
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    return f"`{metavar}`" + (" …" if action.nargs in ("+", "*") else "")


def _command_section(name: str, parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    lines = [f"## `dpscope {name}`", "", _cell(COMMANDS[name].help) + ".", ""]
    if parser.description:
        lines += [_cell(parser.description), ""]
    lines += ["| argument | value | default | what |", "|---|---|---|---|"]
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        flags = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
        what = _cell(formatter._expand_help(action)) if action.help else ""
        default = "required" if not action.option_strings else _default(action)
        lines.append(f"| {flags} | {_value(action)} | {default} | {what} |")
    return [*lines, ""]


def cli_md() -> str:
    """docs/reference/cli.md from the parsers (independent of the terminal and Python version)."""
    top = build_parser()
    lines = [
        "# `dpscope` command reference",
        "",
        "Generated from the argparse parsers by `make docs` (`python -m bench.docs`); "
        "tests/test_docs.py fails when it is out of date. `dpscope COMMAND --help` prints the "
        "same options. Paths are relative to the folder the command runs in. Bad input is one "
        "`dpscope COMMAND: error: ...` line and exit code 2.",
        "",
        _cell(top.description),
        "",
        "| command | what |",
        "|---|---|",
        *(f"| [`{n}`](#dpscope-{n}) | {_cell(c.help)} |" for n, c in COMMANDS.items()),
        "",
    ]
    for name in COMMANDS:
        lines += _command_section(name, command_parser(name))
    return "\n".join(lines).rstrip() + "\n"


def _scalars(obj: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, Any]]:
    """(dotted key, value) for the numbers, strings and booleans two levels deep."""
    if isinstance(obj, dict) and depth < 3:
        out: list[tuple[str, Any]] = []
        for key, value in obj.items():
            if key not in ("recorded", "machine"):
                out += _scalars(value, f"{prefix}{key}.", depth + 1)
        return out
    if isinstance(obj, int | float | str | bool) or obj is None:
        return [(prefix.rstrip("."), obj)]
    return []  # lists (every repeat) stay in the JSON


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "—" if value is None else _cell(value)


def _result_section(name: str, path: Path) -> list[str]:
    """The lines of one bench's section from its result file: its stamp, then every scalar."""
    record = json.loads(path.read_text(encoding="utf-8"))
    stamp = record.get("recorded") or {}
    machine = stamp.get("machine") or record.get("machine") or {}
    where = ", ".join(f"{k} {_cell(v)}" for k, v in machine.items()) or "not recorded"
    return [
        f"## {name}",
        "",
        f"- date: {stamp.get('date') or 'not recorded'}",
        f"- commit: {stamp.get('commit') or 'not recorded'}",
        f"- machine: {where}",
        "",
        "| result | value |",
        "|---|---|",
        *(f"| `{k}` | {_fmt(v)} |" for k, v in _scalars(record)),
        "",
    ]


def benchmarks_md(bench_dir: Path = BENCH_DIR, previous: str = "") -> str:
    """docs/benchmarks.md from `bench_dir`/*.json: one section per benchmark, in name order. A
    benchmark of the `previous` page without a result here keeps its section as it was: a run
    of one bench must not erase the others' last results."""
    files = {p.stem: p for p in sorted(bench_dir.glob("*.json"))} if bench_dir.is_dir() else {}
    kept = {k: v for k, v in bench_sections(previous).items() if k not in files}
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make docs` from the results of `make bench` (bench-overhead, "
        "bench-analysis), `make bench-report`, `make bench-family` and `make bench-projection` (its summary; every "
        "round stays beside its runs) in reports/bench/*.json. "
        "To regenerate: run those targets, then `make docs` (a bench not run again keeps its last"
        " section). Each section names the date, commit "
        "and machine of its run; the numbers are medians over interleaved repeats (bench/common.py)"
        " and every repeat is in the JSON; `load_avg_1m` says how busy the machine was. Goals are"
        " checked by the benches, never by the tests.",
        "",
        "- **overhead** (`make bench-overhead`): smallcnn, batch 64, 40 steps, one device: a profiled"
        " run, the same with `--no-profile`, and a plain hand-written loop. `unprofiled_steps_ratio`"
        " = the profiled run's samples/s (its unprofiled steps) ÷ the `--no-profile` run's (goal"
        " ≥ 0.99); `plain_loop_ratio` = `--no-profile` ÷ the plain loop (goal ≥ 0.98).",
        "- **hta** (`make bench-analysis`): dpscope against HTA 0.5.0 on the same 8 ranks of the"
        " 47 MB df_index_resolver trace, in one run, interleaved; `speedup_vs_hta` = HTA's median"
        " analysis time ÷ dpscope's with every trace decoded (goal ≥ 10), `cpu_ratio_vs_hta` ="
        " HTA's median CPU seconds (user + system, the job and all its workers) ÷ dpscope's,"
        " `rss_*_ratio_vs_hta` ="
        " dpscope's peak RSS ÷ HTA's (goal ≤ 0.5); `dpscope_cached` is a second report of the same"
        " traces with `--cache`.",
        "- **analysis** (`make bench-analysis`): a real trace copied to 8 … 1,024 ranks, analysed"
        " serially (`--workers 1`), by the local process pool and on a Dask LocalCluster: time per"
        " rank (goal: flat within 20 %), RSS summed over the job's processes (goal: < 1 GB at 256"
        " ranks), of the client and of the largest worker (flat: a worker holds one trace).",
        "- **report** (`make bench-report`): the report's build time for the 8-run demo and a"
        " 100-run sweep (goal: the sweep within 15 s).",
        "- **projection** (`make bench-projection`): per workload the median error over the rounds"
        " of the single → 2, DDP 1 → 2, replay, self-replay and exposed-comm arms, and the"
        " coverage of the banded ones (the share of rounds whose measured step lies inside the"
        " band); goals in docs/guides/projection.md (≤ 10 / 10 / 5 / 2 / 10 %, coverage ≥ 0.8).",
        "- **family** (`make bench-family`): DDP, ZeRO-1 and FSDP2 on `gpt` (2 gloo ranks),"
        " interleaved: samples/s, model state per rank (exact: static total + FSDP2's unsharded"
        " peak) and peak RSS per rank, and each sharded mode's ratios to DDP; the host's 1-minute"
        " load average before and after. The machine is shared: the ratios within one run hold,"
        " the absolute numbers are a busy machine's until re-run quiet.",
        "- **demo_load** (`make bench-demo-load`): `make demo` beside a bursty CPU hog (4"
        " processes, each busy half of every 2 s: on an otherwise idle 2-core machine a load"
        " of about 4; `load_avg_1m_*` say what it was), for this tree (`after`) and an older"
        " checkout (`before`, `BEFORE=DIR`), one after the other: the throughput range and"
        " spread over a group's runs, the speedup (median and 95% CI over rounds where the tree"
        " has them), the efficiency, the largest part of its split beside the loss it splits,"
        " the quiet and busy steps, and the verdict (goal: the verdict quotes no number it knows"
        " is noise; with quiet steps, its figures come from them). Another run kept beside it"
        " (`BENCH_OUT=reports/bench/demo_load_<label>.json`) gets its own section:"
        " `demo_load_busier` was measured while other jobs held the load at 11 to 15.",
        "- **suite_load** (`make test-load`): the whole suite (`pytest`) beside a CPU hog on"
        " every core (bench/cpuhog.py, always on): `exit_code` (0: it passed), `wall_s`, the"
        " 1-minute load average as the hog started and the highest while the suite ran (goal:"
        " it passes). No section below means it was not recorded on the machine that generated"
        " this page.",
        "",
    ]
    if not files and not kept:
        lines += ["No benchmark results were recorded when this page was generated.", ""]
    for name in sorted({*files, *kept}):
        if name in kept:
            lines += [kept[name], ""]
            continue
        lines += _result_section(name, files[name])
    return "\n".join(lines).rstrip() + "\n"


# Sections of benchmarks.md measured by hand rather than by a bench (the test suite's time on a
# quiet and a loaded machine): make docs keeps them, from this heading to the end of the page.
KEPT_HEADING = "## Test suite"


def _split_kept(page: str) -> tuple[str, str]:
    """(the page up to KEPT_HEADING, the hand-recorded end from it on; "" without one)."""
    at = page.find(f"\n{KEPT_HEADING}\n")
    return (page, "") if at < 0 else (page[:at], page[at:])


def bench_sections(page: str) -> dict[str, str]:
    """The bench sections of a benchmarks.md page by name (`## name` up to the next `## `), the
    hand-recorded end (KEPT_HEADING on) left out."""
    pieces = re.split(r"(?m)^## ", _split_kept(page)[0])[1:]
    return {p.split("\n", 1)[0].strip(): ("## " + p).rstrip() for p in pieces}


def kept_sections(page: str) -> str:
    """The hand-recorded end of a benchmarks.md page, from KEPT_HEADING on ("" without one)."""
    kept = _split_kept(page)[1]
    return kept.rstrip() + "\n" if kept else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.docs", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--check", action="store_true", help="only check cli.md and the field tables are current"
    )
    args = parser.parse_args(argv)
    page = RUN_FOLDER_MD.read_text(encoding="utf-8")
    wanted = {CLI_MD: cli_md(), RUN_FOLDER_MD: with_field_tables(page)}
    if args.check:
        stale = [p for p, text in wanted.items() if not p.is_file() or p.read_text("utf-8") != text]
        for path in stale:
            print(f"{path.relative_to(REPO)} is out of date: run `make docs`", file=sys.stderr)
        return 1 if stale else 0
    for path, text in wanted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)}")
    # Without results here the page keeps the last recorded ones rather than losing them.
    if any(BENCH_DIR.glob("*.json")) or not BENCH_MD.exists():
        old = BENCH_MD.read_text(encoding="utf-8") if BENCH_MD.exists() else ""
        BENCH_MD.write_text(benchmarks_md(previous=old) + kept_sections(old), encoding="utf-8")
        print(f"wrote {BENCH_MD.relative_to(REPO)}")
    else:
        print(f"{BENCH_MD.relative_to(REPO)} kept: no reports/bench/*.json here (run make bench)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
