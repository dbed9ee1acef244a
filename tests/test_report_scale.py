"""Issue 15: the report stays readable at 100 runs. A sweep-shaped folder is made by copying the
session's real runs (new ids, seeds, world sizes, backends, platforms; plus skipped records), and
its report is checked against an 8-run demo-shaped folder: at most 3 MB of HTML, at most twice the
demo's printed pages in Chromium, and every group of the sweep present. (Its build time is a
benchmark, `make bench-report`, not an assert: these machines are noisy.)"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from analysis.report import build_report
from bench.report import make_demo, make_sweep
from tests.test_report_browser import chromium

pytestmark = pytest.mark.browser


def printed_pages(html: Path, tmp: Path) -> int:
    pdf = tmp / f"{html.parent.name}.pdf"
    subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp / 'p'}",
         "--no-pdf-header-footer", f"--print-to-pdf={pdf}", html.resolve().as_uri()],
        capture_output=True, timeout=180, check=True,
    )  # fmt: skip
    return len(re.findall(rb"/Type\s*/Page(?!s)", pdf.read_bytes()))


@pytest.mark.timeout(600)
def test_hundred_run_sweep_report_stays_readable(single_mlp_run, ddp_mlp_run, tmp_path):
    sweep, demo = tmp_path / "sweep", tmp_path / "demo"
    sweep.mkdir()
    demo.mkdir()
    assert make_sweep(single_mlp_run, ddp_mlp_run, sweep, seeds=5, oses=("Linux", "Windows")) == 100
    assert make_demo(single_mlp_run, ddp_mlp_run, demo) == 8
    big = build_report([sweep], tmp_path / "r-sweep", progress=False)
    small = build_report([demo], tmp_path / "r-demo", progress=False)

    html = big.index_html.read_text()
    assert len(html.encode()) <= 3 * 2**20, f"{len(html.encode()) / 2**20:.1f} MB"
    pages, demo_pages = (
        printed_pages(big.index_html, tmp_path),
        printed_pages(small.index_html, tmp_path),
    )
    assert demo_pages > 0 and pages <= 2 * demo_pages, (pages, demo_pages)

    summary = json.loads(big.summary_json.read_text())
    # Every group of the sweep: per platform, single + 2 backends x 3 world sizes, 5 seeds each.
    groups = {(g["os"], g["mode"], g["backend"], g["world_size"]) for g in summary["groups"]}
    assert len(groups) == 2 * (1 + 2 * 3)
    assert all(g["n_seeds"] == 5 for g in summary["groups"])
    # Issue 27: every DDP group's efficiency-loss split sums exactly to its measured loss.
    split = [g for g in summary["groups"] if g["efficiency_loss_pts"]]
    assert len(split) == 2 * 2 * 3  # per platform: gloo and nccl at 2, 4 and 8 ranks
    for g in split:
        total = sum(v or 0.0 for v in g["efficiency_loss_pts"].values())
        assert abs(total - 100 * (1 - g["scaling_efficiency_mean"])) < 1e-9, g["run_ids"][0]
    assert html.count('<p class="verdict"') == 2  # one paragraph per platform's workload
    headline = (big.index_html.parent / "headline.csv").read_text().splitlines()
    assert len(headline) == 1 + len(groups)
    # 30 skipped runs fold into one line with their count; a finding names at most 4 runs.
    assert html.count("<strong>30 skipped</strong>") == 1
    assert "and 26 more" in html
