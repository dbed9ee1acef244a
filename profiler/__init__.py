"""dpscope's profiler: the run-folder contract, the training-loop instruments and RunRecorder.

`from profiler import RunRecorder` imports torch only when RunRecorder is first used, so the
torch-free modules (profiler.runfolder.layout, profiler.runfolder.records, ...) stay importable without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from profiler.recorder import RunRecorder

__all__ = ["RunRecorder"]


def __getattr__(name: str) -> Any:
    if name == "RunRecorder":
        from profiler.recorder import RunRecorder

        return RunRecorder
    raise AttributeError(f"module 'profiler' has no attribute {name!r}")
