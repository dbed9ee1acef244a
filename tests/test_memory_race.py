"""MemoryTracker: a reading taken before a peak reset must never land after it.

The sampler thread and the training loop both sample; `mark_first_step` resets the peaks between
the two windows. The interleaving that matters (a sample reads RSS, the reset runs, the sample
then stores its old reading) cannot be produced on demand with a real process, so the process's
`memory_info` is replaced by one that holds the sampler inside its read until the reset has had
every chance to run.
"""

from __future__ import annotations

import threading
import types

import torch

from profiler.memory import MemoryTracker

BEFORE, AFTER = 9 * 2**30, 2**20  # RSS before the reset (huge) and after it (small)


class HeldProcess:
    """`memory_info()` returns BEFORE on the sampler thread, after waiting to be released, and
    AFTER on any other thread."""

    def __init__(self) -> None:
        self.sampler: threading.Thread | None = None
        self.reading = threading.Event()
        self.release = threading.Event()

    def memory_info(self) -> types.SimpleNamespace:
        if threading.current_thread() is self.sampler:
            self.reading.set()
            self.release.wait(timeout=60)
            return types.SimpleNamespace(rss=BEFORE)
        return types.SimpleNamespace(rss=AFTER)


def test_a_reading_from_before_a_reset_does_not_survive_it():
    tracker = MemoryTracker(rank=0, devices=[torch.device("cpu")])
    process = HeldProcess()
    tracker._process = process
    sampler = threading.Thread(target=tracker._sample)
    process.sampler = sampler
    sampler.start()
    assert process.reading.wait(timeout=60)  # the sampler holds a pre-reset reading
    resetter = threading.Thread(target=tracker._reset_peaks)
    resetter.start()
    resetter.join(timeout=0.5)  # unlocked reads let the reset finish here, before the store
    process.release.set()
    sampler.join(timeout=60)
    resetter.join(timeout=60)
    assert not sampler.is_alive() and not resetter.is_alive()
    (entry,) = tracker.summary()
    assert entry["peak_rss_bytes"] == AFTER  # only readings taken after the reset count
