"""How `analysis/` words an error that is not bad input of a kind it knows.

Bad input raises `profiler.runfolder.errors.InputError`, the one bad-input type of the whole
project: it lives in the contract, below both halves, because the typed run-folder readers raise it
too. Its message is a single line for the user (the file or argument at fault, what is wrong, what
to do), which the CLI prints as `<prog>: error: <message>` with exit code 2
(profiler.runfolder.errors.run_command). Anything else is a bug and keeps its traceback, except in
a batch, where `unexpected` words it as one skipped item and the batch goes on.
"""

from __future__ import annotations

__all__ = ["unexpected"]


def unexpected(err: BaseException) -> str:
    """One line for an exception that is not an InputError (a hostile or broken file hit a
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
