"""Plain aligned tables for the `python -m analysis` commands (main, ops, project).

Below every command module, so each prints with the same headers, units and formats as the report
(analysis/columns.py) without importing another command's module.
"""

from __future__ import annotations

import re
import sys
from typing import TextIO

import pandas as pd

from analysis.columns import Column, fmt
from analysis.jsonsafe import clip

__all__ = ["safe_text", "say", "table"]

# What a terminal would act on instead of showing: C0 controls (ESC starts ANSI/OSC sequences),
# DEL, C1 controls, bidi overrides/isolates (text that reads differently than it is stored), and
# lone surrogates (printing them raises UnicodeEncodeError). Newlines are kept only between lines.
_UNSAFE_RE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(m: re.Match) -> str:
    return f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}"


def safe_text(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every control character shown as its escape (`\\x1b`), never sent raw."""
    if keep_newlines:
        return "\n".join(_UNSAFE_RE.sub(_escape, line) for line in text.split("\n"))
    return _UNSAFE_RE.sub(_escape, text)


def say(text: object = "", *, file: TextIO | None = None) -> None:
    """print() for the commands' terminal output: trace and record strings made safe."""
    print(safe_text(str(text), keep_newlines=True), file=file or sys.stdout)


def table(rows: list[dict], columns: list[Column]) -> str:
    """Render `rows` as a plain aligned table with the report's headers, units and formats."""
    if not rows:
        return "(none)"
    frame = pd.DataFrame(
        # Record strings can be megabytes long: clipped for display, whole in the JSON.
        [{c.header: safe_text(fmt(clip(r.get(c.key)), c, r)) for c in columns} for r in rows],
        columns=[c.header for c in columns],
    )
    return frame.to_string(index=False)
