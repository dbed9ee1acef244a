"""comm.csv of a `make bench-comm` run folder decoded and validated at the boundary
(docs/reference/run-folder.md): profiler.runfolder.inputfile's reading rules, then exactly COMM_COLUMNS (each
once), at most `MAX_COMM_ROWS` rows, every number finite and in range (`world_size` a whole number
from 1 to MAX_RANKS, `bytes` a whole number ≥ 0, `iters` ≥ 1, times and bandwidths ≥ 0), no
(collective, world_size, bytes) row twice and, given run.json's `config.world_size`, every row
at that world size. The first broken rule raises InvalidRecord naming the file, column and line.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from profiler.runfolder.errors import InputError
from profiler.runfolder.inputfile import read_regular
from profiler.runfolder.layout import COMM_COLUMNS
from profiler.runfolder.records import InvalidRecord, short_repr
from profiler.runfolder.schema import MAX_RANKS

__all__ = ["MAX_COMM_ROWS", "read_comm_csv"]

MAX_COMM_ROWS = 10_000  # a benchmark writes collectives × sizes (tens of rows)
_FIX = "re-run `make bench-comm`"
_WHOLE = ("world_size", "bytes", "iters")


def _bad(path: Path, col: str, i: int, problem: str, cell: object = None) -> InvalidRecord:
    shown = f" (cell {short_repr(cell)})" if cell is not None else ""
    return InvalidRecord(path, f"{col}, line {i + 2}", f"{problem}{shown}", _FIX)


def _parse(path: Path) -> pd.DataFrame:
    try:
        data = read_regular(path, "comm.csv", _FIX)
    except InputError as err:
        raise InvalidRecord(path, "", err.what, err.fix) from None
    header = data.split(b"\n", 1)[0].decode("utf-8", "replace").strip().split(",")
    if header != COMM_COLUMNS:
        dup = [c for i, c in enumerate(header) if c in header[:i]]
        what = f"column `{dup[0]}` given twice" if dup else "other columns than comm.csv's"
        raise InvalidRecord(path, "", f"{what} (expected {','.join(COMM_COLUMNS)})", _FIX)
    if data.count(b"\n") > MAX_COMM_ROWS + 1:
        raise InvalidRecord(path, "", f"over {MAX_COMM_ROWS:,} rows", _FIX)
    try:
        return pd.read_csv(
            io.BytesIO(data), dtype=str, keep_default_na=False, encoding_errors="strict"
        )
    except (ValueError, pd.errors.ParserError) as err:
        raise InvalidRecord(path, "", f"unreadable ({' '.join(str(err).split())})", _FIX) from None


def read_comm_csv(path: Path, *, world_size: int | None = None) -> pd.DataFrame:
    """comm.csv as a DataFrame: `collective` and `backend` text, the other columns float64."""
    path = Path(path)
    frame = _parse(path)
    for col in COMM_COLUMNS[2:]:
        text = frame[col]
        values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float)
        with np.errstate(invalid="ignore"):
            rules = [
                (np.isnan(values), "not a number"),
                (~np.isfinite(values), "not a finite number"),
                (values < 0, "negative"),
                (
                    (values != np.floor(values)) if col in _WHOLE else np.zeros_like(values, bool),
                    "not a whole number",
                ),
                ((values < 1) if col == "iters" else np.zeros_like(values, bool), "below 1"),
                (
                    (values > MAX_RANKS) if col == "world_size" else np.zeros_like(values, bool),
                    f"over {MAX_RANKS:,} ranks",
                ),
                ((values < 1) if col == "world_size" else np.zeros_like(values, bool), "below 1"),
            ]
        for mask, problem in rules:
            if mask.any():
                i = int(np.argmax(mask))
                raise _bad(path, col, i, problem, text.iloc[i])
        frame[col] = values
    dup = frame.duplicated(["collective", "world_size", "bytes"]).to_numpy()
    if dup.any():
        i = int(np.argmax(dup))
        raise _bad(path, "collective", i, "this collective, world size and size given twice")
    if world_size is not None and (other := frame["world_size"].to_numpy() != world_size).any():
        i = int(np.argmax(other))
        n = int(frame["world_size"].iloc[i])
        raise _bad(path, "world_size", i, f"{n}, but run.json config.world_size is {world_size}")
    return frame
