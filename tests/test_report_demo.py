"""Issue 27: the report of a `make demo`-shaped folder (8 runs: 2 seeds of single, DDP gloo and the
skipped DP and DDP nccl runs, plus a real comm benchmark), read in a real headless Chromium:

- the verdict is the first section, one paragraph of at most 3 lines per workload, its numbers
  are the tables' numbers and link to sections that exist;
- no two tick labels of one axis overlap in any figure (bounding boxes of the SVG <text>
  elements, measured by the browser; a figure made to overlap proves the check can fail);
- no table is wider than its box at 1,400 px (scrollWidth against clientWidth);
- the page is at most 600 KB and prints to at most 10 pages with every section present.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest

from analysis.report import build_report
from analysis.report.figures import RC
from analysis.report.verdict import NOT_ENOUGH_QUIET
from bench.report import make_demo
from tests.test_report_browser import Browser, chromium
from tests.test_report_scale import printed_pages

SECTIONS = ["verdict", "summary", "scaling", "speedup", "efficiency", "breakdown",
            "communication", "operators", "projection", "memory", "accuracy", "environment",
            "traces"]  # fmt: skip
MAX_KB, MAX_PAGES, WIDTH = 600, 10, 1400

# Every tick label of every axis of an SVG figure: [axis id, [[text, left, top, right, bottom]]].
TICKS_JS = """
Array.from(document.querySelectorAll('g[id^="matplotlib.axis"]')).map(a => [a.id,
  Array.from(a.querySelectorAll('g[id^="xtick_"] text, g[id^="ytick_"] text'))
    .filter(t => t.textContent.trim())
    .map(t => { const r = t.getBoundingClientRect();
                return [t.textContent, r.left, r.top, r.right, r.bottom]; })])
"""


@pytest.fixture(scope="module")
def demo(single_mlp_run, ddp_mlp_run, comm_run, tmp_path_factory) -> Path:
    """The demo's runs (copies of the session's golden runs) and a real 2-rank comm benchmark
    (the golden one)."""
    runs = tmp_path_factory.mktemp("demo-runs")
    assert make_demo(single_mlp_run, ddp_mlp_run, runs) == 8
    shutil.copytree(comm_run, runs / comm_run.name)
    return build_report([runs], tmp_path_factory.mktemp("demo-report"), progress=False).index_html


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(chromium(), tmp_path_factory.mktemp("profile"))
    yield b
    b.close()


def overlaps(boxes: list[list]) -> list[tuple[str, str]]:
    """Pairs of labels whose boxes intersect by more than half a pixel both ways."""
    out = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            dx = min(a[3], b[3]) - max(a[1], b[1])
            dy = min(a[4], b[4]) - max(a[2], b[2])
            if dx > 0.5 and dy > 0.5:
                out.append((a[0], b[0]))
    return out


def svg_figures(html: str, folder: Path) -> list[Path]:
    folder.mkdir(exist_ok=True)
    uris = re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', html)
    paths = []
    for i, b64 in enumerate(uris):
        (path := folder / f"figure-{i}.svg").write_bytes(base64.b64decode(b64))
        paths.append(path)
    return paths


def test_demo_report_has_every_section_filled(demo):
    html = demo.read_text(encoding="utf-8")
    for sid in SECTIONS:
        assert f'<section id="{sid}">' in html, sid
    assert html.index('id="verdict"') < html.index('id="summary"')
    assert "No projection" not in html and 'id="figure-projection"' in html
    assert 'id="figure-efficiency"' in html
    summary = json.loads((demo.parent / "summary.json").read_text())
    (ddp,) = [g for g in summary["groups"] if g["mode"] == "ddp"]
    parts = ddp["efficiency_loss_pts"]
    loss = 100 * (1 - ddp["scaling_efficiency_mean"])
    assert sum(v or 0.0 for v in parts.values()) == pytest.approx(loss, abs=1e-9)
    # The CSV keeps the full ids; the page shows labels with the id in the tooltip.
    csv = (demo.parent / "summary.csv").read_text()
    assert all(r["run_id"] in csv for r in summary["runs"])
    assert f'title="{ddp["run_ids"][0]}">ddp·gloo·n2·s' in html


def test_verdict_is_first_short_and_quotes_the_tables(demo, browser):
    browser.load(demo.as_uri(), WIDTH, False)
    first = browser.eval("document.querySelector('main section').id")
    assert first == "verdict"
    paras = browser.eval(
        "Array.from(document.querySelectorAll('#verdict p.verdict')).map(p => [p.textContent,"
        " p.getBoundingClientRect().height, parseFloat(getComputedStyle(p).lineHeight),"
        " p.getBoundingClientRect().top])"
    )
    assert len(paras) == 1  # one workload
    text, height, line, top = paras[0]
    assert height <= 3 * line + 1, (height, line, text)
    assert top < 900, "the verdict is on the first screen"
    summary = json.loads((demo.parent / "summary.json").read_text())
    (ddp,) = [g for g in summary["groups"] if g["mode"] == "ddp"]
    if ddp["noisy_run_ids"]:  # the session's runs were measured on a busy machine: no figure
        assert NOT_ENOUGH_QUIET in text and "×" not in text.split("Memory")[0], text
    else:
        assert f"{ddp['speedup_mean']:.2f}× over single device" in text
        assert f"{100 * ddp['scaling_efficiency_mean']:.0f}% efficiency" in text
        assert f"{ddp['exposed_comm_pct_mean']:.0f}% exposed" in text
        assert "Projected at 8 ranks" in text and "replay error" in text
    # Every link of the verdict goes to a section of this page.
    hrefs = browser.eval("Array.from(document.querySelectorAll('#verdict a')).map(a => a.hash)")
    assert hrefs and all(browser.eval(f"!!document.getElementById('{h[1:]}')") for h in hrefs)
    assert browser.problems() == []


def test_no_tick_labels_overlap_in_any_figure(demo, browser, tmp_path):
    figures = svg_figures(demo.read_text(encoding="utf-8"), tmp_path / "svg")
    assert len(figures) >= 12
    checked = 0
    for svg in figures:
        browser.load(svg.as_uri(), WIDTH, False)
        for axis, boxes in browser.eval(TICKS_JS):
            assert not overlaps(boxes), (svg.name, axis, overlaps(boxes))
            checked += len(boxes)
    assert checked > 100  # the figures' labels really were measured
    assert browser.problems() == []


def test_the_overlap_check_catches_crowded_ticks(browser, tmp_path):
    import matplotlib.pyplot as plt

    plt.rcParams.update(RC)
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_xticks(range(0, 60_000, 2_500))  # 24 labels of 6 characters on 3 inches
    ax.set_xlim(0, 60_000)
    fig.savefig(svg := tmp_path / "crowded.svg", format="svg")
    plt.close(fig)
    browser.load(svg.as_uri(), WIDTH, False)
    assert any(overlaps(boxes) for _, boxes in browser.eval(TICKS_JS))


def wide_tables(page: Path, browser) -> list:
    """[table id, scroll width, box width] of every table of `page` wider than its box at
    1,400 px, then the page's own overflow, in px (0 when nothing is wider)."""
    browser.load(page.as_uri(), WIDTH, False)
    widths = browser.eval(
        "Array.from(document.querySelectorAll('table')).map(t => [t.id || t.dataset.table,"
        " t.parentElement.scrollWidth, t.parentElement.clientWidth])"
    )
    assert len(widths) >= 10
    over = browser.eval("document.documentElement.scrollWidth - window.innerWidth")
    return [w for w in widths if w[1] > w[2] + 1] + ([["page", over]] if over > 1 else [])


def test_no_table_is_wider_than_the_page_at_1400px(demo, browser):
    assert not wide_tables(demo, browser)


def test_demo_page_size_and_printed_pages(demo, browser, tmp_path):
    size = demo.stat().st_size
    assert size <= MAX_KB * 1000, f"{size / 1000:.0f} KB"
    pages = printed_pages(demo, tmp_path)
    assert 0 < pages <= MAX_PAGES, pages
    # Printing hides only the navigation and filters: every section has a height in print media.
    browser.load(demo.as_uri(), WIDTH, False)
    browser.send("Emulation.setEmulatedMedia", {"media": "print"}, session=True)
    heights = browser.eval(
        f"{json.dumps(SECTIONS)}.map(id => document.getElementById(id).offsetHeight)"
    )
    assert all(h > 50 for h in heights), dict(zip(SECTIONS, heights, strict=True))
    assert browser.eval("getComputedStyle(document.querySelector('nav')).display") == "none"
    browser.send("Emulation.setEmulatedMedia", {"media": ""}, session=True)
