"""Files stay readable: no first-party or test file over 400 lines (declarative schema and column
modules excepted), no function over 80.

ruff's C901 (complexity), PLR0913 (arguments) and PLR0915 (statements) hold the rest
(pyproject.toml); this test holds what ruff can't count.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source_trees import parse_file

REPO = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 400
# Declarative modules (a schema, a table of column specs: one entry per field or column, no
# logic) may be as long as what they declare; splitting them would only scatter one list.
DECLARATIVE = {"profiler/runfolder/schema.py", "analysis/columns.py"}
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    tops = ("analysis", "bench", "profiler", "workloads", "tests")
    return sorted(p for top in tops for p in (REPO / top).rglob("*.py") if "data" not in p.parts)


def test_no_file_over_400_lines():
    long = {
        str(p.relative_to(REPO)): n
        for p in _sources()
        if str(p.relative_to(REPO)) not in DECLARATIVE
        and (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, long


def test_no_function_over_80_lines():
    long = {}
    for path in _sources():
        for node in ast.walk(parse_file(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(REPO)}:{node.lineno} {node.name}"] = lines
    assert not long, long
