"""Plain aligned tables for the `python -m analysis` commands (main, ops, project).

Below every command module, so each prints with the same headers, units and formats as the report
(analysis/columns.py) without importing another command's module.
"""

from __future__ import annotations

import pandas as pd

from analysis.columns import Column, fmt
from analysis.jsonsafe import clip

__all__ = ["table"]


def table(rows: list[dict], columns: list[Column]) -> str:
    """Render `rows` as a plain aligned table with the report's headers, units and formats."""
    if not rows:
        return "(none)"
    frame = pd.DataFrame(
        # Record strings can be megabytes long: clipped for display, whole in the JSON.
        [{c.header: fmt(clip(r.get(c.key)), c, r) for c in columns} for r in rows],
        columns=[c.header for c in columns],
    )
    return frame.to_string(index=False)
