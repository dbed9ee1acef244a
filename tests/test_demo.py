"""`dpscope demo` end to end, as a newcomer runs it (issue 27): real runs in every mode this
machine has (FSDP2 beside DDP), a 1-rank DDP run and a short comm benchmark, so every section of
the report is filled, "where the efficiency went" included DDP's own cost, and the projections
show."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import REPO
from tests.test_cli import run_dpscope
from tests.test_report_browser import Browser, chromium
from tests.test_report_demo import wide_tables

pytestmark = pytest.mark.integration


def test_the_demo_fills_every_section(tmp_path) -> None:
    # The demo's own options, made tiny: the run kinds are the real demo's, two rounds (its
    # default, --repeat auto, runs 3 to 5).
    args = ["demo", "--model", "mlp", "--max-steps", "8", "--seeds", "0", "--repeat", "2"]
    proc = run_dpscope([*args, "--runs-dir", "runs", "--out", "rep"], cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/run.json")]
    kinds = {(r["config"].get("mode"), r["config"].get("world_size"), r["status"]) for r in runs}
    assert {("single", 1, "ok"), ("ddp", 2, "ok"), ("ddp", 1, "ok"), ("fsdp", 2, "ok")} <= kinds
    assert [r["status"] for r in runs if r.get("kind") == "comm"] == ["ok"]
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    (group,) = [g for g in summary["groups"] if g["mode"] == "ddp" and g["world_size"] == 2]
    assert group["efficiency_loss_pts"]["ddp_overhead"] is not None
    assert group["n_rounds"] == 2 and group["speedup_ci95_low"] <= group["speedup_median"]
    assert "stopped after 2 round(s): 2 of 2 rounds" in proc.stdout
    assert summary["projections"], summary.get("projection_skipped")
    html = (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")
    assert html.index('id="verdict"') < html.index('id="summary"')
    assert "No projection" not in html
    # FSDP2 beside DDP (issue 30): the family table, its verdict line, its projection
    assert 'id="family"' in html and ("FSDP2 saves" in html or "FSDP2 costs" in html)
    strategies = {p.get("strategy") for p in summary["projections"]}
    assert "fsdp" in strategies, summary.get("projection_skipped")
    # With every member and its rounds, each table still fits a 1,400 px page in a real browser.
    browser = Browser(chromium(), tmp_path / "profile")
    try:
        assert not wide_tables(tmp_path / "rep" / "index.html", browser)
    finally:
        browser.close()


def test_make_demo_is_dpscope_demo_with_the_make_variables() -> None:
    dry = subprocess.run(
        ["make", "-n", "demo", "MODEL=gpt", "SEEDS=3 4", "NPROC=2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = " ".join(dry.stdout.split("\\\n")).split("workloads.tools.cli demo", 1)[1]
    words = line.split()
    assert "--model" in words and words[words.index("--model") + 1] == "gpt"
    assert '"3' in line and "--nproc 2" in line and "--max-steps" not in line
