"""The one error type for bad input, and the one wrapper every command's `main` runs under.

`UserError` is the base of every project exception that means "the user asked for something that
can't be done" (a missing folder, an impossible launch, an unwritable output): its `str` is one
line naming the file or argument, what is wrong and what to do. `run_command` prints it as
`<prog>: error: <message>` and returns exit code 2, the same shape as argparse's own errors (see
`OneLineParser`). Any other exception is a bug and keeps its traceback.

`DiskError` is the UserError of a write the disk refused (full, read-only, no permission, a name
too long, a file where a folder should be): `disk_writes(path)` turns such an OSError into one line
naming the path; every other OSError is left as it is.

It lives in profiler/, the bottom layer, so that analysis/ and workloads/ can both subclass it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

__all__ = [
    "DiskError",
    "InputError",
    "OneLineParser",
    "UserError",
    "disk_error",
    "disk_writes",
    "import_main",
    "run_command",
    "safe_text",
]


class UserError(Exception):
    """Bad input: `str(err)` is one line naming the file or argument, the problem and the fix."""


class InputError(UserError):
    """Bad input: `str(err)` is one line naming the file/argument, the problem and the fix (a
    UserError built from those three parts; the CLI prints it as one line, exit code 2)."""

    def __init__(self, where: str, what: str, fix: str) -> None:
        self.where, self.what, self.fix = str(safe_text(str(where))), what, fix
        super().__init__(f"{self.where}: {what} — {fix}")


_LONE = re.compile("[\ud800-\udfff]")


def safe_text(text: str) -> str:
    """`text` with lone surrogates (a non-UTF-8 file name read with surrogateescape, a JSON
    `\\udc80`) replaced by U+FFFD: encodable as UTF-8 and drawable by any font layer."""
    return _LONE.sub("\ufffd", text) if _LONE.search(text) else text


# errno -> (what the disk said, what to do): the faults a writer meets that are the machine's,
# not dpscope's (a bug keeps its traceback).
_DISK_FAULTS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on the device", "free space there or write to another disk"),
    errno.EDQUOT: ("disk quota exceeded", "free space there or write to another disk"),
    errno.EROFS: ("the file system is read-only", "write to a writable folder"),
    errno.EACCES: ("permission denied", "write to a folder you may write to"),
    errno.EPERM: ("operation not permitted", "write to a folder you may write to"),
    errno.ENAMETOOLONG: ("the name is too long for the file system", "use a shorter name"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder", "pass a folder"),
    errno.EEXIST: ("a file is in the way of a folder", "pass a folder"),
    errno.ENOENT: ("a folder on the way does not exist (or cannot be made there)", "pass a folder"),
}


class DiskError(UserError):
    """A write the disk refused; `str(err)` is `PATH: what the disk said (ERRNO) — fix`."""

    def __init__(self, path: str | os.PathLike[str], err: OSError) -> None:
        self.path, self.errno = str(path), err.errno
        what, fix = _DISK_FAULTS.get(err.errno or 0, (err.strerror or str(err), "check the path"))
        name = errno.errorcode.get(err.errno or 0, "")
        super().__init__(f"{self.path}: {what}{f' ({name})' if name else ''} — {fix}")


def disk_error(err: OSError, path: str | os.PathLike[str] | None = None) -> DiskError | None:
    """`err` as a DiskError naming `path` (else the file the error names), or None when it is
    not a disk fault (_DISK_FAULTS)."""
    if isinstance(err, DiskError):
        return err
    if err.errno not in _DISK_FAULTS:
        return None
    return DiskError(err.filename if path is None and err.filename else (path or "?"), err)


@contextlib.contextmanager
def disk_writes(path: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Turn a disk fault (ENOSPC, EROFS, EACCES, ENAMETOOLONG, not a folder, ...) raised inside
    the block into a DiskError naming `path` (default: the file the OSError names)."""
    try:
        yield
    except OSError as err:
        if (disk := disk_error(err, Path(path) if path is not None else None)) is None:
            raise
        raise disk from None


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (`prog: error: ...`, exit code 2) instead of
    the whole usage block; `--help` still shows everything."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def run_command(prog: str, body: Callable[[], int], *, interrupted: str | None = None) -> int:
    """Run one command's `body`; a UserError becomes one `prog: error: ...` line and exit code 2.

    A reader that leaves early (`dpscope runs RUNS | head`) ends the output quietly with exit
    code 1, instead of a BrokenPipeError traceback on the next print. With `interrupted` (what
    an interruption leaves, e.g. "nothing half-written was left"), Ctrl-C is one
    `prog: interrupted (Ctrl-C) — ...` line and exit code 130; without it, KeyboardInterrupt
    propagates (commands with their own shutdown, such as the launcher).
    """
    try:
        return body()
    except UserError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        print(f"{prog}: interrupted (Ctrl-C) — {interrupted}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def import_main(module: str, prog: str) -> Callable[..., int]:
    """`module.main`, imported so that Ctrl-C while its libraries load (pandas, torch: seconds on
    a busy machine) is one `prog: interrupted (Ctrl-C) ...` line and exit code 130, not a
    traceback from inside an import.

    Every entry point (`dpscope NAME`, each `python -m` module) imports its command through this,
    and the packages above it import nothing heavy (tests/test_cli.py), so the guard covers the
    whole load.
    """
    try:
        return importlib.import_module(module).main
    except KeyboardInterrupt:
        print(f"{prog}: interrupted (Ctrl-C) while loading — nothing was written", file=sys.stderr)
        raise SystemExit(130) from None
