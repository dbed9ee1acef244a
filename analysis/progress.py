"""The analysis's progress bars: tqdm without its monitor thread.

tqdm starts a monitor thread with its first bar, even a disabled one. A pool forked while that
thread runs could inherit a lock it holds (tqdm's own, or stderr's while it redraws a stalled
bar) and hang on it. The trace workers are forked only from a process with no other thread
(analysis.trace.executors.fork_is_safe), so these bars never start one: they redraw on their own
updates only.
"""

from __future__ import annotations

from tqdm import tqdm

__all__ = ["Bar"]


class Bar(tqdm):
    """tqdm with `monitor_interval = 0`: no monitor thread (module docstring)."""

    monitor_interval = 0
