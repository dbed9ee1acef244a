"""steps.csv decoded once, columnar, and validated at the boundary (docs/reference/run-folder.md).

`read_steps_frame` parses the file with pandas' C parser straight into typed columns (no dict or
Struct per row, so a 1,000,000-row file costs about its own size in memory) and checks every
column at once: the header (each StepRow column at most once, the required ones present), every
cell of its type and range, no row with more cells than the header, no (rank, step) row twice,
no cell longer than `MAX_CELL_CHARS`, and, given the run's world size, no rank beyond it. The
first broken rule raises InvalidRecord naming the file, the column and the line.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from profiler.runfolder.errors import InputError
from profiler.runfolder.inputfile import read_regular
from profiler.runfolder.records import InvalidRecord, short_repr
from profiler.runfolder.schema import REQUIRED_STEP_COLUMNS, StepRow

__all__ = ["MAX_CELL_CHARS", "read_steps", "read_steps_frame"]

MAX_CELL_CHARS = 131_072  # the stdlib csv module's field limit: no steps.csv cell comes close
_FLAGS = ("warmup", "profiled")
_COUNTS = ("rank", "step", "epoch", "samples", "rss_bytes", "cuda_allocated_bytes")
_SECONDS = ("step_time_s", "data_s", "forward_s", "backward_s", "optimizer_s", "profiler_s")
# Non-negative real numbers (seconds, cores): no whole-number rule.
_REALS = (*_SECONDS, "other_cpu_cores")
_ANY_FLOAT = ("loss",)
COLUMNS = (*_FLAGS, *_COUNTS, *_REALS, *_ANY_FLOAT)


def _bad(path: Path, col: str, i: int, problem: str, cell: Any = None) -> InvalidRecord:
    shown = f" (cell {short_repr(cell)})" if cell is not None else ""
    # Line 1 is the header, so row i is on line i + 2.
    return InvalidRecord(path, f"{col}, line {i + 2}", f"{problem}{shown}")


def _header(path: Path, data: bytes) -> list[str]:
    first = data.split(b"\n", 1)[0][: 64 * 1024].decode("utf-8", "replace")
    names = next(csv.reader([first]), [])
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidRecord(path, name, "column given twice in the header")
        seen.add(name)
    missing = [f for f in REQUIRED_STEP_COLUMNS if f not in seen]
    if missing:
        raise InvalidRecord(path, missing[0], "column missing from the header")
    return names


def _parse(path: Path, data: bytes) -> pd.DataFrame:
    try:
        return pd.read_csv(
            io.BytesIO(data),
            keep_default_na=False,
            na_values=[""],
            encoding="utf-8",
            encoding_errors="strict",
            dtype={c: str for c in _FLAGS},  # "True" must not become a bool column
        )
    except UnicodeDecodeError as err:
        raise InvalidRecord(
            path, "", f"not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None
    except pd.errors.ParserError as err:
        m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(err))
        if m:
            raise InvalidRecord(
                path, f"line {m[2]}", "more cells than the header has columns"
            ) from None
        raise InvalidRecord(path, "", f"unreadable ({' '.join(str(err).split())})") from None
    except (ValueError, OverflowError) as err:
        raise InvalidRecord(path, "", f"unreadable ({err})") from None


def _numeric(path: Path, frame: pd.DataFrame, col: str) -> pd.Series:
    """Column `col` as float64 (NaN where empty); InvalidRecord at its first non-number cell."""
    raw = frame[col]
    if pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_bool_dtype(raw):
        return raw.astype(float)
    text = raw.astype("str").where(raw.notna())
    longest = text.str.len()
    if (longest > MAX_CELL_CHARS).any():
        i = int(np.argmax((longest > MAX_CELL_CHARS).to_numpy()))
        problem = (
            f"a cell of {int(longest.iloc[i]):,} characters, over the {MAX_CELL_CHARS:,} limit"
        )
        raise _bad(path, col, i, problem)
    values = pd.to_numeric(text, errors="coerce")
    bad = values.isna() & text.notna()
    if col in _ANY_FLOAT:  # a diverged loss is written as nan
        bad &= text.str.strip().str.lower() != "nan"
    if bad.any():
        i = int(np.argmax(bad.to_numpy()))
        raise _bad(path, col, i, "not a number", text.iloc[i])
    return values.astype(float)


def _check(path: Path, col: str, values: pd.Series, required: bool) -> pd.Series:
    """`values` of column `col` checked against its StepRow type; the typed column."""
    v = values.to_numpy()
    rules: list[tuple[np.ndarray, str]] = []
    if required:
        rules.append((np.isnan(v), "empty, but every row needs it"))
    present = ~np.isnan(v)
    if col in _ANY_FLOAT:  # nan (a diverged loss) is allowed, ±inf (or a 200 kB number) is not
        if (bad := np.isinf(v)).any():
            i = int(np.argmax(bad))
            raise _bad(path, col, i, "not a finite number", values.iloc[i])
        return values
    with np.errstate(invalid="ignore"):
        rules.append((present & ~np.isfinite(v), "not a finite number"))
        rules.append((present & (v < 0), "negative"))
        if col not in _REALS:
            rules.append((present & (v != np.floor(v)), "not a whole number"))
        if col in _FLAGS:
            rules.append((present & (v > 1), "neither 0 nor 1"))
        if col not in _REALS:
            rules.append((present & (v > 2**63 - 1), "too large"))
    for mask, problem in rules:
        if mask.any():
            i = int(np.argmax(mask))
            raise _bad(path, col, i, problem, values.iloc[i])
    return values.astype("int64") if required and col not in _REALS else values


def read_steps_frame(path: Path, *, world_size: int | None = None) -> pd.DataFrame:
    """steps.csv as one typed DataFrame (StepRow's columns; empty optional cells NaN).

    Raises InputError when the file is missing or not a regular file (profiler.runfolder.inputfile),
    InvalidRecord at the first broken rule (see the module docstring). `world_size`: the run's
    config.world_size; a rank at or beyond it is then invalid too."""
    path = Path(path)
    try:
        data = read_regular(path, "steps.csv", "fix or remove this run folder")
    except InputError as err:
        if err.what == "missing":
            raise
        raise InvalidRecord(path, "", err.what, err.fix) from None
    names = _header(path, data)
    frame = _parse(path, data)
    del data
    if list(frame.columns) != names:  # pandas renamed a column (it cannot be told apart)
        raise InvalidRecord(path, "", "a header pandas cannot read as given")
    required = set(REQUIRED_STEP_COLUMNS)
    for col in (c for c in StepRow.__struct_fields__ if c in frame.columns):
        frame[col] = _check(path, col, _numeric(path, frame, col), col in required)
    dup = frame.duplicated(["rank", "step"]).to_numpy()
    if dup.any():
        i = int(np.argmax(dup))
        rank, step = int(frame["rank"].iloc[i]), int(frame["step"].iloc[i])
        raise _bad(path, "rank, step", i, f"rank {rank} step {step} given twice")
    if world_size is not None and (beyond := frame["rank"].to_numpy() >= world_size).any():
        i = int(np.argmax(beyond))
        rank = int(frame["rank"].iloc[i])
        raise _bad(path, "rank", i, f"rank {rank} beyond run.json config.world_size {world_size}")
    return frame


def read_steps(path: Path) -> list[StepRow]:
    """steps.csv as StepRows (read_steps_frame's rules): for the tools' small folders."""
    frame = read_steps_frame(path)
    rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
    return msgspec.convert(
        [{k: v for k, v in r.items() if v is not None} for r in rows], list[StepRow], strict=False
    )
