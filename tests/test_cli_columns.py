"""The analysis CLI prints its tables with the report's column spec (analysis/columns.py): the
same headers, units and number formats, and one byte convention per table; it never loads the
report package."""

from __future__ import annotations

import sys

from analysis.cli.main import print_traces
from analysis.columns import (
    BYTE_UNITS,
    CLI_COLLECTIVE_COLS,
    CLI_RANK_COLS,
    CLI_STRAGGLER_COLS,
    COLLECTIVE_COLS,
    MEMORY_COLS,
    SUMMARY_COLS,
)
from analysis.trace.folder import analyze_trace_dir
from tests.conftest import DATA, run_in_repo

TB_NCCL = DATA / "tbplugin" / "test_distributed_nccl"


def test_cli_tables_show_the_report_headers_and_formats(capsys):
    result = analyze_trace_dir(TB_NCCL, progress=False)
    print_traces(result)
    lines = capsys.readouterr().out.splitlines()
    for cols in (CLI_RANK_COLS, CLI_COLLECTIVE_COLS, CLI_STRAGGLER_COLS):
        header = next(ln for ln in lines if cols[0].header in ln and cols[-1].header in ln)
        assert all(c.header in header for c in cols), header
    report = {c.key: c for c in COLLECTIVE_COLS}
    assert all(report[c.key] == c for c in CLI_COLLECTIVE_COLS)  # the very same specs
    allreduce = next(c for c in result["collectives"] if c["name"] == "nccl:all_reduce")
    row = next(ln for ln in lines if ln.strip().startswith("nccl:all_reduce"))
    assert f"{allreduce['bytes_total'] / 1e6:,.1f}" in row.split()  # decimal MB, as GB/s


def test_one_byte_convention_per_table():
    """Bytes next to GB/s (10⁹ B/s) are decimal MB; memory tables are binary MiB throughout."""

    def units(cols):
        return {c.unit for c in cols if c.kind == "bytes"}

    assert units(COLLECTIVE_COLS) == {"MB"} and any(c.unit == "GB/s" for c in COLLECTIVE_COLS)
    assert units(MEMORY_COLS) == units(SUMMARY_COLS) == {"MiB"}
    assert set(BYTE_UNITS) == {"MB", "MiB"} and BYTE_UNITS["MB"] == 10**6


def test_the_cli_never_imports_the_report_package():
    """Every subcommand's module is imported by the CLI (`ops`/`diff` included); none of them may
    pull in analysis.report, or its matplotlib and Jinja2, to print a table."""
    code = (
        "import sys, analysis.cli.main, analysis.cli.ops, analysis.cli.project\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'jinja2', 'seaborn')"
        " or m.startswith('analysis.report')]\n"
        "assert not bad, bad"
    )
    proc = run_in_repo([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == 0, proc.stderr
