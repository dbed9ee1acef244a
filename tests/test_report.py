"""The HTML report built from real run folders (single + 2-rank gloo DDP MLP from conftest).

Numbers on the page are cross-checked against `python -m analysis runs --json`; untrusted strings
(an op name in a trace, run.json's hostname) must render as text; broken run folders are listed.
"""

from __future__ import annotations

import json
import math
import subprocess
from html.parser import HTMLParser

import pytest

from analysis.cli.main import main as analysis_main
from analysis.cli.report import main as report_main
from tests.conftest import in_process

SECTIONS = [
    "summary",
    "speedup",
    "breakdown",
    "communication",
    "memory",
    "accuracy",
    "environment",
    "traces",
]
SECTION_TABLES = {
    "summary": "summary",
    "speedup": "speedup",
    "breakdown": "phases",
    "communication": "collectives",
    "memory": "memory",
    "accuracy": "accuracy",
    "environment": "environment",
    "traces": "traces",
}
INJECT = '<script>alert("dpscope")</script>'


class Page(HTMLParser):
    """Tables (id -> rows of {data-key: (data-value, text)}), sections, images, links, scripts."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[dict]] = {}
        self.section_of_table: dict[str, str] = {}
        self.section_imgs: dict[str, list[str]] = {}
        self.findings: list[str] = []
        self.links: list[str] = []
        self.scripts = 0
        self.text: list[str] = []
        self._section = self._table = self._cell = None
        self._row: dict | None = None
        self._finding: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self._section = a.get("id")
            self.section_imgs.setdefault(self._section, [])
        elif tag == "table":
            self._table = a["data-table"]
            self.tables[self._table] = []
            self.section_of_table[self._table] = self._section
        elif tag == "tr" and self._table and a is not None:
            self._row = {"_run_id": a.get("data-run-id")}
        elif tag == "td" and self._row is not None:
            self._cell = [a.get("data-key"), a.get("data-value"), []]
        elif tag == "img":
            self.section_imgs.setdefault(self._section, []).append(a["src"])
        elif tag == "a" and "href" in a:
            self.links.append(a["href"])
        elif tag == "script":
            self.scripts += 1
        elif tag == "li" and "data-rule" in a:
            self._finding = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            key, value, text = self._cell
            self._row[key] = (value, "".join(text).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if len(self._row) > 1:
                self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "li" and self._finding is not None:
            self.findings.append("".join(self._finding).strip())
            self._finding = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell[2].append(data)
        if self._finding is not None:
            self._finding.append(data)

    def row(self, table: str, **match) -> dict:
        rows = [
            r
            for r in self.tables[table]
            if all(r.get(k, (None, None))[0] == str(v) for k, v in match.items())
        ]
        assert len(rows) == 1, f"{table}: {len(rows)} rows match {match}"
        return rows[0]


COMMANDS = {"analysis": analysis_main, "analysis.report": report_main}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` (`-m analysis` or `-m analysis.report`), run in this process."""
    assert args[0] == "-m", args
    return in_process(COMMANDS[args[1]], list(args[2:]))


def same(cell_value: str | None, expected) -> bool:
    if expected is None:
        return cell_value == ""
    if isinstance(expected, str):
        return cell_value == expected
    return math.isclose(float(cell_value), float(expected), rel_tol=1e-12, abs_tol=1e-12)


@pytest.fixture(scope="module")
def built(single_mlp_run, ddp_mlp_run, tmp_path_factory):
    """(report folder, CLI stdout, the analysis CLI's runs JSON, parsed page)."""
    tmp = tmp_path_factory.mktemp("report")
    runs = [str(single_mlp_run), str(ddp_mlp_run)]
    proc = run_cli("-m", "analysis.report", *runs, "--out", str(tmp / "out"), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    ana = run_cli(
        "-m", "analysis", "runs", *runs, "--json", str(tmp / "runs.json"), "--no-progress"
    )
    assert ana.returncode == 0, ana.stderr
    expected = json.loads((tmp / "runs.json").read_text())
    page = Page((tmp / "out" / "index.html").read_text(encoding="utf-8"))
    return tmp / "out", proc.stdout, expected, page


@pytest.mark.integration
def test_cli_prints_path_and_file_url(built):
    out, stdout, _, _ = built
    assert str(out / "index.html") in stdout
    assert (out / "index.html").resolve().as_uri() in stdout
    for name in [
        "summary.json",
        "summary.csv",
        "phases.csv",
        "collectives.csv",
        "memory.csv",
        "accuracy.csv",
    ]:
        assert (out / name).is_file(), name


@pytest.mark.integration
def test_every_section_has_its_table_and_an_embedded_figure(built):
    _, _, _, page = built
    for section in SECTIONS:
        table = SECTION_TABLES[section]
        assert page.section_of_table.get(table) == section, f"table {table} not in #{section}"
        assert page.tables[table], f"table {table} is empty"
        imgs = page.section_imgs.get(section)
        assert imgs and all(s.startswith("data:image/svg+xml;base64,") for s in imgs), section
    assert page.scripts == 1  # only our own sort script


@pytest.mark.integration
def test_summary_numbers_match_analysis_json(built):
    _, _, expected, page = built
    runs = expected["runs"]
    assert {r["_run_id"] for r in page.tables["summary"]} == {r["run_id"] for r in runs}
    keys = [
        "status",
        "mode",
        "backend",
        "world_size",
        "samples_per_s",
        "speedup",
        "scaling_efficiency",
        "comm_pct",
        "exposed_comm_pct",
        "peak_memory_bytes",
        "memory_imbalance_pct",
        "profiler_overhead_pct",
    ]  # top1_pct: the accuracy table's, per group (the summary's CSV keeps each run's)
    for run in runs:
        row = page.row("summary", run_id=run["run_id"])
        for key in keys:
            if key in row:  # numeric columns empty for every run are hidden
                assert same(row[key][0], run[key]), (run["run_id"], key, row[key], run[key])
            else:
                assert all(r[key] is None for r in runs), key
    ddp = next(r for r in runs if r["mode"] == "ddp")
    assert ddp["speedup"] and ddp["comm_pct"] is not None  # the real pipeline filled them
    row = page.row("summary", run_id=ddp["run_id"])
    assert row["speedup"][1] == f"{ddp['speedup']:.2f}"
    assert row["scaling_efficiency"][1] == f"{ddp['scaling_efficiency'] * 100:.1f}"


@pytest.mark.integration
def test_section_tables_match_analysis_json(built):
    _, _, expected, page = built
    for run in expected["runs"]:
        rid = run["run_id"]
        trace_ranks = {r["rank"]: r for r in (run["trace"] or {}).get("ranks", [])}
        for p in run["phases_per_rank_s"]:
            row = page.row("phases", run_id=rid, rank=p["rank"])
            for key in ("data", "forward", "optimizer"):
                assert same(row[f"{key}_s"][0], p[key])
            assert same(row["step_time_s"][0], p["step_time"])
            if run["mode"] == "ddp":  # exposed comm carved out of backward, not added on top
                tr = trace_ranks[p["rank"]]  # the traced share of the step, on steps.csv's step
                exp = min(
                    tr["exposed_comm_us"] / tr["step_time_us_mean"] * p["step_time"], p["backward"]
                )
                assert same(row["exposed_comm_s"][0], exp)
                assert same(row["backward_compute_s"][0], p["backward"] - exp)
                parts = (
                    "data_s",
                    "forward_s",
                    "backward_compute_s",
                    "exposed_comm_s",
                    "optimizer_s",
                )
                stacked = sum(float(row[k][0]) for k in parts) + float(row["other_s"][0])
                assert stacked == pytest.approx(p["step_time"], rel=1e-6)  # the bar is the step
        for m in run["memory"]:
            row = page.row("memory", run_id=rid, rank=m["rank"], device=m["device"])
            assert same(row["peak_rss_bytes"][0], m["peak_rss_bytes"])
        for c in (run["trace"] or {}).get("collectives", []):
            row = page.row("collectives", run_id=rid, name=c["name"])
            for key in ("calls", "bytes_total", "latency_us_avg", "algbw_gbps", "busbw_gbps"):
                assert same(row[key][0], c[key]), (key, row[key], c[key])
        for r in trace_ranks.values():
            row = page.row("overlap", run_id=rid, rank=r["rank"])
            assert same(row["exposed_comm_us"][0], r["exposed_comm_us"])
            assert same(row["tb_overlapping"][0], r["tb_split"]["overlapping"])
    ddp = next(r for r in expected["runs"] if r["mode"] == "ddp")
    assert ddp["trace"] and ddp["trace"]["collectives"], "the DDP run's allreduce is in its traces"
    for g in expected["groups"]:
        row = page.row("accuracy", mode=g["mode"], backend=g["backend"], world_size=g["world_size"])
        for key in ("test_loss_mean", "top1_pct_mean", "top5_pct_mean"):
            assert same(row[key][0], g[key])
        if g["scaling_efficiency_mean"] is not None:  # shown in %, like the Summary's column
            row = page.row(
                "speedup", mode=g["mode"], backend=g["backend"], world_size=g["world_size"]
            )
            # the median [95% CI] over the rounds stands for the mean ± std where it exists
            key = "scaling_efficiency_median" if "scaling_efficiency_median" in row else (
                "scaling_efficiency_mean")  # fmt: skip
            assert same(row[key][0], g[key])
            assert row[key][1].startswith(f"{g[key] * 100:,.1f}")  # fmt's thousands separator
            if g.get("scaling_efficiency_median") is not None:
                assert "scaling_efficiency_mean" not in row
    env = page.row("environment", run_id=ddp["run_id"])
    assert env["hostname"][1] == ddp["hostname"] and env["torch"][1] == ddp["torch"]
