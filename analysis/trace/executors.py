"""Where the per-rank reductions run: in this process, in a pool of worker processes on this
host (the default), or on a Dask cluster (`--executor dask`, analysis/trace/daskexec.py).

Each file is reduced to its rank summary where it is read; only summaries come back, so the
caller's memory grows with the rank count, never with the trace sizes. A bad file costs one
`skipped` line; a worker that dies (killed for memory, a crash) costs the file it held, named, and
the rest is analysed, with `"worker_died": true` on that line (the result is then `partial`).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from analysis.errors import AnalysisError, unexpected
from analysis.trace.cache import summarize_cached
from analysis.trace.rank import RankSummary

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
    cache: bool = False

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise AnalysisError(
                "--executor", f"{self.kind!r} is not an executor", "pass process or dask"
            )
        if self.kind != "dask" and (self.scheduler or self.scheduler_file):
            raise AnalysisError(
                "--scheduler", "needs --executor dask", "add --executor dask, or drop --scheduler"
            )
        if self.scheduler and self.scheduler_file:
            raise AnalysisError(
                "--scheduler", "and --scheduler-file both given", "pass one of them"
            )


def summarize_one(path: Path, cache: bool = False) -> tuple[RankSummary | None, str | None]:
    """One file's summary, or the one-line reason it has none (never raises)."""
    try:
        return summarize_cached(path, cache=cache), None
    except AnalysisError as err:
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


def process_summaries(files: list[Path], ex: Executor) -> Iterator[tuple[Path, Outcome]]:
    """(file, outcome) per file, in this process or a pool of `ex.workers` processes."""
    if ex.workers <= 1 or len(files) == 1:
        for f in files:
            yield f, (*summarize_one(f, ex.cache), False)
        return
    with ProcessPoolExecutor(max_workers=ex.workers) as pool:
        futures = {pool.submit(summarize_one, f, ex.cache): f for f in files}
        for fut in as_completed(futures):
            try:
                yield futures[fut], (*fut.result(), False)
            except Exception as err:  # noqa: BLE001 — a worker killed (e.g. out of memory)
                yield futures[fut], (None, died("worker process", err), True)
