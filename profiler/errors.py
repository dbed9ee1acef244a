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
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = ["InputError", "OneLineParser", "UserError", "run_command"]


class UserError(Exception):
    """Bad input: `str(err)` is one line naming the file or argument, the problem and the fix."""


class InputError(UserError):
    """Bad input: `str(err)` is one line naming the file/argument, the problem and the fix (a
    UserError built from those three parts; the CLI prints it as one line, exit code 2)."""

    def __init__(self, where: str, what: str, fix: str) -> None:
        self.where, self.what, self.fix = str(where), what, fix
        super().__init__(f"{self.where}: {what} — {fix}")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (`prog: error: ...`, exit code 2) instead of
    the whole usage block; `--help` still shows everything."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def run_command(prog: str, body: Callable[[], int]) -> int:
    """Run one command's `body`; a UserError becomes one `prog: error: ...` line and exit code 2.

    A reader that leaves early (`dpscope runs RUNS | head`) ends the output quietly with exit
    code 1, instead of a BrokenPipeError traceback on the next print.
    """
    try:
        return body()
    except UserError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
