"""The rules a RunRecorder (profiler.recorder) holds its user to, each breach one clear error:
the run id (given, from DPSCOPE_RUN_ID, or a default no other recorder gets), one open recorder
per process (torch.profiler allows one session), and what `samples` may be.

Torch-free; the recorder calls these at construction, at each step and at close.
"""

from __future__ import annotations

import operator
import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from profiler.runfolder.layout import validate_run_id
from profiler.session import active

if TYPE_CHECKING:
    from profiler.recorder import RunRecorder

__all__ = [
    "AT_EXIT_WARNING",
    "RUN_ID_FLAG",
    "RUN_ID_ENV",
    "RecorderError",
    "check_samples",
    "claim_process",
    "default_run_id",
    "release_process",
    "resolve_run_id",
]

RUN_ID_FLAG = "RunRecorder(run_id=...)"
RUN_ID_ENV = "DPSCOPE_RUN_ID"
AT_EXIT_WARNING = (
    "the recorder was never closed: it was closed at interpreter exit with what it had "
    "(close it, or use `with RunRecorder(...) as rec:`)"
)
_OPEN: list[RunRecorder] = []  # the open recorder of this process (at most one)


class RecorderError(RuntimeError):
    """A RunRecorder used against its contract; the message says what to do instead."""


def default_run_id() -> str:
    """`recorder-<UTC time to the microsecond>-<pid>`: two recorders never get the same one."""
    return f"recorder-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S.%f')}-{os.getpid()}"


def resolve_run_id(run_id: str | None) -> str:
    """The run id a recorder uses: `run_id`, else DPSCOPE_RUN_ID, else `default_run_id()`;
    validated as every writer's are (profiler.runfolder.layout.validate_run_id, naming its source)."""
    if run_id:
        return validate_run_id(run_id, RUN_ID_FLAG)
    if env_id := os.environ.get(RUN_ID_ENV):
        return validate_run_id(env_id, RUN_ID_ENV)
    return default_run_id()


def claim_process(recorder: RunRecorder) -> None:
    """Make `recorder` this process's one open recorder; RecorderError when another is open or
    dpscope's own profiler runs here (a recorder inside dpscope's training loop)."""
    if _OPEN:
        raise RecorderError(
            f"a RunRecorder for {_OPEN[0].run_dir} is still open in this process; close it first "
            "(torch.profiler allows one session per process; under `--script` dpscope's own "
            "recorder is already recording: drop yours or run without --script)"
        )
    if (session := active()) is not None:
        raise RecorderError(
            f"dpscope's own profiler is running in this process (traces in {session.trace_dir}): "
            f"a RunRecorder for {recorder.run_dir} cannot record inside dpscope's training loop"
        )
    _OPEN.append(recorder)


def release_process(recorder: RunRecorder) -> None:
    """`recorder` is closed: another may open."""
    if recorder in _OPEN:
        _OPEN.remove(recorder)


def check_samples(samples: object) -> int:
    """`samples` as a positive int (ints, numpy ints, integer 0-d tensors); ValueError naming the
    value for a float, a bool, 0 or a negative."""
    try:
        if isinstance(samples, bool):
            raise TypeError
        n = operator.index(samples)  # never truncates a float
    except TypeError:
        raise ValueError(
            f"samples must be a positive integer (this rank's samples in the step); got "
            f"{samples!r} ({type(samples).__name__})"
        ) from None
    if n < 1:
        raise ValueError(f"samples must be a positive integer (>= 1); got {n}")
    return n
