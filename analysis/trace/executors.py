"""Where the per-rank reductions run: in this process, in a pool of worker processes on this
host (the default), or on a Dask cluster (`--executor dask`, analysis/trace/daskexec.py).

Each file is reduced to its rank summary where it is read; only summaries come back, so the
caller's memory grows with the rank count, never with the trace sizes. A bad file costs one
`skipped` line; a worker that dies (killed for memory, a crash) costs the file it held, named, and
the rest is analysed, with `"worker_died": true` on that line (the result is then `partial`).
"""

from __future__ import annotations

import signal
from collections.abc import Generator, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from analysis.errors import unexpected
from analysis.trace.cache import summarize_cached
from analysis.trace.rank import RankSummary
from profiler.runfolder.errors import InputError

__all__ = ["EXECUTORS", "Executor", "Outcome", "died", "process_summaries", "summarize_one"]

EXECUTORS = ("process", "dask")
Outcome = tuple[RankSummary | None, str | None, bool]  # (summary, error, the worker died)


@dataclass(frozen=True, kw_only=True)
class Executor:
    """How to run the reductions: `kind` process (`workers` processes on this host) or dask (a
    LocalCluster sized to this machine, or the cluster at `scheduler` / `scheduler_file`)."""

    kind: str = "process"
    workers: int = 1
    scheduler: str | None = None
    scheduler_file: Path | None = None
    cache: bool | None = None  # None: DPSCOPE_TRACE_CACHE decides (cache.cache_enabled)

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise InputError(
                "--executor", f"{self.kind!r} is not an executor", "pass process or dask"
            )
        if self.kind != "dask" and (self.scheduler or self.scheduler_file):
            raise InputError(
                "--scheduler", "needs --executor dask", "add --executor dask, or drop --scheduler"
            )
        if self.scheduler and self.scheduler_file:
            raise InputError("--scheduler", "and --scheduler-file both given", "pass one of them")


def summarize_one(path: Path, cache: bool = False) -> tuple[RankSummary | None, str | None]:
    """One file's summary, or the one-line reason it has none (never raises)."""
    try:
        return summarize_cached(path, cache=cache), None
    except InputError as err:
        return None, f"{err.what} — {err.fix}"
    except Exception as err:  # noqa: BLE001 — RecursionError, MemoryError, ...: one hostile
        # file costs one line, never the other ranks.
        return None, unexpected(err)


def died(what: str, err: BaseException) -> str:
    """The skipped line of a file whose worker died."""
    problem = " ".join(str(err).split())[:160]
    return (
        f"the {what} analysing it died ({type(err).__name__}{': ' + problem if problem else ''})"
        " — the other files were analysed; re-run it with more memory per worker"
    )


def _ignore_sigint() -> None:
    """In a pool worker: Ctrl-C is the parent's to handle (one line, run_command); a worker that
    took it would print its own traceback, and one waiting for work is not inside any task."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _pool_pass(
    files: list[Path], workers: int, cache: bool
) -> Generator[tuple[Path, Outcome], None, tuple[list[Path], list[Path]]]:
    """Run `files` in a pool, at most workers + 1 in flight. When a worker dies the pool is
    broken: returns (files not started yet, files in flight then: the suspects)."""
    todo = list(reversed(files))
    with ProcessPoolExecutor(max_workers=workers, initializer=_ignore_sigint) as pool:
        flight: dict = {}
        while todo or flight:
            while todo and len(flight) <= workers:
                f = todo.pop()
                flight[pool.submit(summarize_one, f, cache)] = f
            done, _ = wait(flight, return_when=FIRST_COMPLETED)
            for fut in done:
                try:
                    outcome = (*fut.result(), False)
                except BrokenProcessPool:  # a worker died: every file in flight is suspect
                    return list(reversed(todo)), list(flight.values())
                yield flight.pop(fut), outcome
    return [], []


def process_summaries(files: list[Path], ex: Executor) -> Iterator[tuple[Path, Outcome]]:
    """(file, outcome) per file, in this process or a pool of `ex.workers` processes. A file in
    flight when a worker died is retried alone once the others are done; if its worker dies
    again, that file is lost (named), never the others."""
    if ex.workers <= 1 or len(files) == 1:
        for f in files:
            yield f, (*summarize_one(f, ex.cache), False)
        return
    todo, suspects = list(files), []
    while todo:
        todo, lost = yield from _pool_pass(todo, ex.workers, ex.cache)
        suspects += lost
    for f in suspects:
        _, lost = yield from _pool_pass([f], 1, ex.cache)
        if lost:
            yield f, (None, died("worker process", BrokenProcessPool("it died twice")), True)
