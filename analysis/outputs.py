"""Output paths are checked before any work starts: never empty, never a folder where a file is
meant (or a file where a folder is meant), never an input. A wrong `--json` or `--out` must cost one
line, not an overwritten trace or a report written over the run folders."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from profiler.runfolder.errors import InputError

__all__ = ["check_json_out", "check_report_out"]


def _blocking_file(path: Path) -> Path | None:
    """The first existing non-folder among `path`'s parents (the write would fail there)."""
    for parent in reversed(path.parents):
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_json_out(out: Path, inputs: Iterable[Path], input_dirs: Iterable[Path] = ()) -> None:
    """Raise InputError (naming `out`) unless `out` is a writable-looking JSON file path that
    is none of `inputs` and lies in none of `input_dirs` (where it would be read as input)."""

    def refuse(why: str) -> InputError:
        return InputError(out, f"cannot write the JSON ({why})", "pass a new file path to --json")

    if str(out) in ("", ".") or out.name in ("", ".", ".."):
        raise refuse("empty or not a file name")
    if out.is_dir():
        raise refuse("it is a folder")
    if os.path.lexists(out) and not stat.S_ISREG(os.stat(out).st_mode):
        # a device (`/dev/null` as root), FIFO or socket would be replaced by a regular file
        raise refuse("it exists and is not a regular file")
    if (blocker := _blocking_file(out)) is not None:
        raise refuse(f"{blocker} is a file, not a folder")
    target = out.resolve()
    for path in inputs:
        if Path(path).resolve() == target:
            raise refuse("it is an input file and would be overwritten")
    for folder in input_dirs:
        if _inside(target, Path(folder).resolve()):
            raise refuse(f"it is inside the input folder {folder} and would be read as input")


def check_report_out(out: Path, inputs: Iterable[Path]) -> None:
    """Raise InputError unless `out` can hold the report: a folder name (not a file, not inside
    a run folder) that holds no input. Other files in it are left alone (the report swaps in only
    its own files)."""

    def refuse(why: str) -> InputError:
        return InputError(
            f"cannot write the report into {out}", why, "pass another --out (e.g. reports)"
        )

    if str(out) in ("", ".") or out.name in ("", ".", ".."):
        raise refuse("not a folder name (empty, `.`, `..` or a root)")
    if out.exists() and not out.is_dir():
        raise refuse("it is a file, not a folder")
    if (blocker := _blocking_file(out)) is not None:
        raise refuse(f"{blocker} is a file, not a folder")
    target = out.resolve()
    for folder in (target, *target.parents):
        if (folder / "run.json").is_file():
            raise refuse(f"it is inside the run folder {folder}")
    for path in inputs:
        src = Path(path).resolve()
        if _inside(src, target):
            raise refuse(f"it holds the input {path}, which the report would replace")
