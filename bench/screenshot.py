"""The README's picture of the report: headless Chromium opens a built report and saves the top of
the page as a small PNG (a 256-colour palette keeps it small).

    make demo
    python -m bench.screenshot reports/index.html docs/images/report.png
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

__all__ = ["main", "screenshot"]


def screenshot(page: Path, png: Path, *, width: int = 1100, height: int = 760) -> Path:
    """Save the first `width` × `height` CSS pixels of `page` as a palette PNG at `png`."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("bench.screenshot: chromium is not installed (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="dpscope-shot-") as tmp:
        raw = Path(tmp) / "raw.png"
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
        cmd += [f"--user-data-dir={tmp}/profile", f"--window-size={width},{height}"]
        cmd += [f"--screenshot={raw}", page.resolve().as_uri()]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        image = Image.open(raw).convert("RGB").quantize(colors=256)
        png.parent.mkdir(parents=True, exist_ok=True)
        image.save(png, optimize=True)
    return png


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.screenshot", description=__doc__)
    parser.add_argument("page", type=Path, help="a report's index.html")
    parser.add_argument("png", type=Path, help="where the PNG goes")
    args = parser.parse_args(argv)
    png = screenshot(args.page, args.png)
    print(f"wrote {png} ({png.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
