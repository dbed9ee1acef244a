"""The one exception type `analysis/` raises for bad input.

Its message is a single line for the user: the file or argument at fault, what is wrong, and what to
do about it. The CLI prints it as `error: <message>` and exits non-zero; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

__all__ = ["AnalysisError"]


class AnalysisError(Exception):
    """Bad input: `str(err)` is one line naming the file/argument, the problem and the fix."""

    def __init__(self, where: str, what: str, fix: str) -> None:
        self.where, self.what, self.fix = str(where), what, fix
        super().__init__(f"{self.where}: {what} — {fix}")
