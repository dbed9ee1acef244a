"""The one exception type `analysis/` raises for bad input.

Its message is a single line for the user: the file or argument at fault, what is wrong, and what to
do about it. The CLI prints it as `<prog>: error: <message>` with exit code 2 (profiler.runfolder.errors.run_command); anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

from profiler.runfolder.errors import InputError

__all__ = ["AnalysisError", "unexpected"]

# One bad-input type for the whole project: defined below both halves (profiler.runfolder.records, whose
# typed run-folder readers raise it too), so `except AnalysisError` catches an invalid record.
AnalysisError = InputError


def unexpected(err: BaseException) -> str:
    """One line for an exception that is not an AnalysisError (a hostile or broken file hit a
    path no rule covers): the batch records it as a skipped item and goes on."""
    if isinstance(err, RecursionError):
        what = "nested too deeply to analyse (RecursionError)"
    elif isinstance(err, MemoryError):
        what = "ran out of memory while analysing it (MemoryError)"
    else:
        text = " ".join(str(err).split())
        text = text if len(text) <= 200 else text[:199] + "…"
        what = f"could not be analysed ({type(err).__name__}: {text})"
    return f"{what} — check the file; if torch.profiler/dpscope wrote it, report it as a bug"
