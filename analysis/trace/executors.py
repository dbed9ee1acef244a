"""Where the per-rank reductions run: in this process, in a pool of worker processes on this
host (the default), or on a Dask cluster (`--executor dask`, analysis/trace/daskexec.py).

Each file is reduced to its rank summary where it is read; only summaries come back, so the
caller's memory grows with the rank count, never with the trace sizes. A bad file costs one
`skipped` line; a worker that dies (killed for memory, a crash) costs the file it held, named, and
the rest is analysed, with `"worker_died": true` on that line (the result is then `partial`).

Pool workers are forked from the caller only where that is safe: on Linux, from a caller with
no thread but its main one (the analysis's own progress bars start none: analysis/progress.py)
and none of the libraries that keep threads or devices of their own loaded (torch, Dask, ...),
which is what `dpscope traces` and `dpscope report` are. A fork starts in milliseconds, with
everything already imported; a fresh server process costs every job ~0.4 s of imports (docs/
benchmarks.md, hta). Anywhere else they start from a fresh server process (forkserver; spawn where
there is none): a caller that has torch, Dask or a notebook's threads loaded can hold objects or
locks a forked child crashes or hangs on (seen: a segfault in the child's garbage collector after
torch and a Dask cluster had run in the parent). Nor do they re-run the caller's script, as
forkserver and spawn children otherwise do to find its functions: a user's script without an
`if __name__ == "__main__":` guard would run again, training and all, in every worker; the
function they run lives here.
"""

from __future__ import annotations

import gc
import multiprocessing
import signal
import sys
import threading
from collections.abc import Generator, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from analysis.errors import unexpected
from analysis.trace.cache import summarize_cached
from analysis.trace.rank import RankSummary
from profiler.runfolder.errors import InputError

__all__ = [
    "EXECUTORS",
    "Executor",
    "Outcome",
    "died",
    "fork_is_safe",
    "process_summaries",
    "summarize_one",
]

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
    # How pool workers start; None: fork where safe, else forkserver, else spawn (module docstring).
    start_method: str | None = None

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


def _worker_init() -> None:
    """In a pool worker: Ctrl-C is the parent's to handle (one line, run_command); a worker that
    took it would print its own traceback, and one waiting for work is not inside any task.
    SIGTERM ends it: a forked worker would otherwise run the caller's own handler. Garbage
    collection on: a worker forked while the caller paused it (folder.reduce_files) would
    otherwise run without it for its whole life."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    gc.enable()


# Loaded in the caller, these keep threads, devices, sockets or thread pools that are not
# fork-safe (polars' and ray's pools, MPI's registered memory): a forked child must not inherit them.
_NO_FORK_MODULES = (
    "torch", "dask", "distributed", "IPython", "jax", "tensorflow", "polars", "ray", "mpi4py",
    "cupy",
)  # fmt: skip


def fork_is_safe() -> bool:
    """Whether pool workers may be forked from this process (module docstring): Linux, the main
    thread and no other, and none of `_NO_FORK_MODULES` loaded."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return False
    if any(m in sys.modules for m in _NO_FORK_MODULES):
        return False
    return threading.active_count() == 1


def _context(start_method: str | None) -> multiprocessing.context.BaseContext:
    """The pool's start method: `start_method`, else fork where `fork_is_safe()`, else forkserver
    (with this module preloaded in the server, so each worker starts with pandas and numpy
    imported), else spawn."""
    if start_method is None:
        start_method = "spawn"
        if fork_is_safe():
            start_method = "fork"
        elif "forkserver" in multiprocessing.get_all_start_methods():
            start_method = "forkserver"
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload([__name__])
    return ctx


@contextmanager
def _main_script_hidden() -> Iterator[None]:
    """While workers start: the caller's `__main__` shows neither a file nor a module spec, so a
    worker has no script to re-run (module docstring); both are back before anything else runs."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _pool_pass(
    files: list[Path], workers: int, ex: Executor
) -> Generator[tuple[Path, Outcome], None, tuple[list[Path], list[Path]]]:
    """Run `files` in a pool, at most workers + 1 in flight. When a worker dies the pool is
    broken: returns (files not started yet, files in flight then: the suspects)."""
    todo, cache = list(reversed(files)), ex.cache
    ctx = _context(ex.start_method)
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init) as pool:
        flight: dict = {}
        while todo or flight:
            with _main_script_hidden():  # a submit may start a worker; nothing yields inside
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
        todo, lost = yield from _pool_pass(todo, ex.workers, ex)
        suspects += lost
    for f in suspects:
        _, lost = yield from _pool_pass([f], 1, ex)
        if lost:
            yield f, (None, died("worker process", BrokenProcessPool("it died twice")), True)
