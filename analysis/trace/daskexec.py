"""`--executor dask`: the per-rank reductions as tasks on a dask.distributed cluster; the client
(this process) gets back summaries only and does the cross-rank merge (docs/guides/sharded-analysis.md).

Without `--scheduler`/`--scheduler-file` a LocalCluster sized to this machine is started: one
single-threaded worker process per core, each with its share of the memory (dask's `auto`
limit), so a worker holds one trace at a time and its memory is bounded by the largest trace.
Workers open the trace files by the paths this process sees: on a cluster they need the same
shared file system and dpscope installed (`pip install "dpscope[dask]"`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from analysis.trace.executors import Executor, Outcome, died, summarize_one
from profiler.runfolder.errors import InputError

__all__ = ["CONNECT_ENV", "DASK_PIP", "check_executor", "dask_summaries"]

DASK_PIP = 'pip install "dpscope[dask]"'
CONNECT_ENV = "DPSCOPE_DASK_CONNECT_S"  # how long to try to reach a scheduler (default 10 s)


def _distributed():
    try:
        import distributed
    except ImportError:
        raise InputError(
            "--executor dask",
            "dask.distributed is not installed",
            f"run `{DASK_PIP}` (or `pip install dask distributed`), or drop --executor dask",
        ) from None
    return distributed


def _connect_s() -> float:
    try:
        return max(0.5, float(os.environ.get(CONNECT_ENV, "10")))
    except ValueError:
        return 10.0


def _scheduler_file(path: Path) -> str:
    """The scheduler file's path, after checking it is one (`dask scheduler --scheduler-file`)."""
    try:
        info = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        why = getattr(err, "strerror", None) or "not JSON"
        raise InputError(
            path,
            f"cannot read the Dask scheduler file ({why})",
            "pass the file `dask scheduler --scheduler-file FILE` wrote",
        ) from None
    if not isinstance(info, dict) or not isinstance(info.get("address"), str):
        raise InputError(
            path,
            "is not a Dask scheduler file (no `address`)",
            "pass the file `dask scheduler --scheduler-file FILE` wrote",
        )
    return info["address"]


@contextlib.contextmanager
def _client(ex: Executor) -> Iterator:
    distributed = _distributed()
    if ex.scheduler is None and ex.scheduler_file is None:
        cluster = distributed.LocalCluster(
            n_workers=os.cpu_count() or 1,
            threads_per_worker=1,  # one trace per worker at a time: memory bounded by one trace
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        )
        with cluster, distributed.Client(cluster) as client:
            yield client
        return
    address = ex.scheduler or _scheduler_file(ex.scheduler_file)
    flag = "--scheduler" if ex.scheduler else f"--scheduler-file {ex.scheduler_file}"
    try:
        client = distributed.Client(address, timeout=_connect_s())
    except (OSError, TimeoutError, ValueError) as err:
        problem = " ".join(str(err).split())[:160]
        raise InputError(
            flag,
            f"cannot reach the Dask scheduler at {address} ({problem})",
            "start it (`dask scheduler`) or check the address and port",
        ) from None
    with client:
        yield client


def check_executor(ex: Executor) -> None:
    """One line now, before any work, when dask is missing or the scheduler file is no good."""
    _distributed()
    if ex.scheduler_file is not None:
        _scheduler_file(ex.scheduler_file)


def _run(client, distributed, files: list[Path], cache: bool):
    """(file, outcome or None when its worker died) per file, as the cluster finishes them."""
    # pure=False: a file's summary is never taken from another client's cache of the key.
    futures = client.map(summarize_one, [str(f) for f in files], cache=cache, pure=False)
    by_key = {fut.key: f for fut, f in zip(futures, files, strict=True)}
    for fut in distributed.as_completed(futures):
        try:
            summary, error = fut.result()
            yield by_key[fut.key], (summary, error, False), None
        except Exception as err:  # noqa: BLE001 — KilledWorker, a lost connection, ...
            yield by_key[fut.key], None, err
        fut.release()  # the summary is ours now: the cluster need not keep it


def dask_summaries(files: list[Path], ex: Executor) -> Iterator[tuple[Path, Outcome]]:
    """(file, outcome) per file. A worker that dies takes the tasks it held: those files are
    retried one at a time once the rest is done, so only a file that kills its worker again
    is lost (named, `worker_died`)."""
    distributed = _distributed()
    with _client(ex) as client:
        suspects = []
        for f, outcome, _ in _run(client, distributed, files, ex.cache):
            if outcome is None:
                suspects.append(f)
            else:
                yield f, outcome
        for f in suspects:
            for _, outcome, err in _run(client, distributed, [f], ex.cache):
                yield f, outcome or (None, died("Dask worker", err), True)
