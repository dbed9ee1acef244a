"""JSON output is always valid JSON: non-finite floats (inf, NaN) become null, with a warning.

`json.dumps(..., allow_nan=False)` refuses them, and `allow_nan=True` writes `Infinity`/`NaN`,
which strict parsers (browsers' JSON.parse, jq) reject; so every analysis result passes through
`finite_json` before it is written, and each replacement is named in `warnings`.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["DISPLAY_CHARS", "OWN_LINE_CHARS", "clip", "finite_json"]

MAX_WARNINGS = 20  # one line per replaced value, up to this many; then one line with the count


def finite_json(obj: Any, warnings: list[str]) -> Any:
    """`obj` with every non-finite float replaced by None (in place for dicts and lists).

    Appends one line per replaced value to `warnings`, naming its path (e.g. `runs[2].speedup`).
    """
    found: list[str] = []
    stack: list[tuple[Any, str]] = [(obj, "")]  # iterative: a deep result must not recurse
    while stack:
        node, where = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            path = f"{where}.{key}" if isinstance(node, dict) else f"{where}[{key}]"
            if isinstance(value, float) and not math.isfinite(value):
                node[key] = None
                found.append(f"{path.lstrip('.')} = {value}")
            elif isinstance(value, dict | list):
                stack.append((value, path))
    for line in sorted(found)[:MAX_WARNINGS]:
        warnings.append(f"non-finite value `{line}` written as null")
    if len(found) > MAX_WARNINGS:
        warnings.append(
            f"... and {len(found) - MAX_WARNINGS} more non-finite values written as null"
        )
    return obj


DISPLAY_CHARS = 200  # strings from records are shown up to this long; JSON outputs keep them whole
# dpscope's own long lines (a skipped input's reason, which starts with a path; tune commands):
# a long path must not cut off what is wrong and what to do. Still bounded: a path and our text.
OWN_LINE_CHARS = 10 * DISPLAY_CHARS


def clip(value: Any, limit: int = DISPLAY_CHARS) -> Any:
    """A string cut to `limit` characters for display (`…` and the full length appended)."""
    if not isinstance(value, str) or len(value) <= limit:
        return value
    return f"{value[:limit]}… ({len(value):,} chars)"
