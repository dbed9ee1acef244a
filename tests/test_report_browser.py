"""The report in a real headless Chromium: it loads from disk, logs no console error, throws no
exception, requests nothing outside the page (file:/data: only), and renders at laptop and phone
widths (screenshots). The browser is driven over the DevTools protocol on a pipe
(`--remote-debugging-pipe`: fd 3 in, fd 4 out, NUL-separated JSON), so no port and no extra
package are needed. A negative check proves the watcher catches errors and external requests.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis.report import build_report

pytestmark = pytest.mark.browser

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# A tiny trampoline: put our pipe ends on fds 3/4, where --remote-debugging-pipe expects them.
TRAMPOLINE = (
    "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)
WIDTHS = {"laptop": (1280, False), "phone": (390, True)}


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        return exe
    if shutil.which("apt-get") is None:
        pytest.skip("chromium is not installed and apt-get is unavailable to install it")
    pytest.fail("chromium is not installed: run `.ci/run` or `apt-get install -y chromium`")


class Browser:
    """One headless Chromium with a fresh profile, spoken to over the DevTools pipe."""

    def __init__(self, exe: str, profile: Path) -> None:
        to_r, self._w = os.pipe()
        self._r, from_w = os.pipe()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                TRAMPOLINE,
                str(to_r),
                str(from_w),
                exe,
                *FLAGS,
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            pass_fds=(to_r, from_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_r)
        os.close(from_w)
        self._buf, self._id, self.events = b"", 0, []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=True)

    def _recv(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        msg = json.loads(raw)
        if "method" in msg:
            self.events.append(msg)
        return msg

    def send(
        self, method: str, params: dict | None = None, *, session: bool = False, timeout: float = 30
    ) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while (reply := self._recv(deadline)).get("id") != self._id:
            pass
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def load(self, url: str, width: int, mobile: bool) -> bytes:
        """Open `url` at `width` CSS px, wait for load + a moment for scripts; full-page PNG."""
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": mobile},
            session=True,
        )
        start = len(self.events)
        self.send("Page.navigate", {"url": url}, session=True)
        deadline = time.monotonic() + 30
        while not any(e["method"] == "Page.loadEventFired" for e in self.events[start:]):
            self._recv(deadline)
        self.send(
            "Runtime.evaluate",
            {"expression": "new Promise(r => setTimeout(r, 300))", "awaitPromise": True},
            session=True,
        )
        shot = self.send(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=True
        )
        return base64.b64decode(shot["data"])

    def eval(self, expression: str):
        return self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True
        )["result"].get("value")

    def problems(self) -> list[str]:
        """Console errors/warnings, uncaught exceptions, log errors and non-local requests so far."""
        out = []
        for e in self.events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p["type"] in ("error", "warning", "assert"):
                out.append(f"console.{p['type']}: {[a.get('value') for a in p['args']]}")
            elif m == "Runtime.exceptionThrown":
                out.append(f"exception: {p['exceptionDetails'].get('text')}")
            elif m == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
                out.append(f"log {p['entry']['level']}: {p['entry']['text']}")
            elif m == "Network.requestWillBeSent" and not p["request"]["url"].startswith(
                ("file:", "data:")
            ):
                out.append(f"request: {p['request']['url']}")
        return out

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        os.close(self._w)
        os.close(self._r)


@pytest.fixture
def browser(tmp_path):
    b = Browser(chromium(), tmp_path / "profile")
    yield b
    b.close()


@pytest.fixture(scope="module")
def report(single_mlp_run, ddp_mlp_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("browser-report")
    return build_report([single_mlp_run, ddp_mlp_run], out, progress=False).index_html


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def test_watcher_catches_console_errors_exceptions_and_external_requests(browser, tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><body><img src="http://example.invalid/x.png">'
        '<link rel="stylesheet" href="https://cdn.example.invalid/a.css">'
        '<script>console.error("boom"); missingFunction();</script></body></html>'
    )
    browser.load(bad.as_uri(), 800, False)
    found = "\n".join(browser.problems())
    assert "console.error" in found and "boom" in found
    assert "exception" in found
    assert "request: http://example.invalid/x.png" in found
    assert "request: https://cdn.example.invalid/a.css" in found


def test_report_loads_clean_at_laptop_and_phone_width(browser, report, tmp_path):
    for name, (width, mobile) in WIDTHS.items():
        png = browser.load(report.as_uri(), width, mobile)
        (tmp_path / f"report-{name}.png").write_bytes(png)
        assert browser.problems() == [], name
        w, h = _png_size(png)
        assert w >= width - 20 and h > 2000, (name, w, h)  # the whole page, not a blank viewport
        # Nothing wider than the viewport except inside the scrolling table/figure wrappers.
        overflow = browser.eval("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{name}: page is {overflow}px wider than the screen"
        imgs = browser.eval(
            "Array.from(document.images).filter(i => i.complete && i.naturalWidth > 0).length"
        )
        assert imgs == browser.eval("document.images.length") >= 8
    assert browser.problems() == []


def test_tables_sort_on_header_click(browser, report):
    browser.load(report.as_uri(), 1280, False)
    order = (
        "Array.from(document.querySelectorAll('#table-summary tbody tr')).map(r => r.dataset.runId)"
    )
    before = browser.eval(order)
    browser.eval("document.querySelector('#table-summary th[data-key=samples_per_s]').click()")
    up = browser.eval(order)
    browser.eval("document.querySelector('#table-summary th[data-key=samples_per_s]').click()")
    down = browser.eval(order)
    assert sorted(before) == sorted(up) and up == down[::-1] and len(up) == 2
    assert (
        browser.eval(
            "document.querySelector('#table-summary th[data-key=samples_per_s]')"
            ".getAttribute('aria-sort')"
        )
        == "descending"
    )
    assert browser.problems() == []
