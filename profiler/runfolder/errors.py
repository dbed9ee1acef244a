"""The one error type for bad input, and the one wrapper every command's `main` runs under.

`UserError` is the base of every project exception that means "the user asked for something that
can't be done" (a missing folder, an impossible launch, an unwritable output): its `str` is one
line naming the file or argument, what is wrong and what to do. `run_command` prints it as
`<prog>: error: <message>` and returns exit code 2, the same shape as argparse's own errors (see
`OneLineParser`). Any other exception is a bug and keeps its traceback.

It lives in profiler/, the bottom layer, so that analysis/ and workloads/ can both subclass it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = ["InputError", "OneLineParser", "UserError", "run_command", "safe_text"]


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
