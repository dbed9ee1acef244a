"""The first-party sources parsed once per session: the house-rule tests (code size, layering,
where children start) each walk every module, and parsing is most of their time."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path


@cache
def _parse(text: str, filename: str) -> ast.Module:
    return ast.parse(text, filename)


def parse_file(path: Path) -> ast.Module:
    """`path` parsed, from a cache keyed on its text and name (a file rewritten by a test is
    parsed again). Callers only read the tree."""
    return _parse(path.read_text(encoding="utf-8"), str(path))
