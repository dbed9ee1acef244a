"""Memory per rank process and per CUDA device, for run.json `metrics.memory` and steps.csv.

Recorded, per device the rank touches (DataParallel touches every GPU, so the GPU-0 imbalance
shows; DDP touches one):
- `peak_allocated_bytes` / `peak_reserved_bytes`: torch's caching-allocator peaks on that device
  (`torch.cuda.max_memory_allocated` / `max_memory_reserved`); null on CPU.
- `nvml_used_bytes`: the highest device-wide used memory NVML reported while sampling (all
  processes on the GPU, including the CUDA context); null on CPU or without nvidia-ml-py.
- `peak_rss_bytes`: the highest resident set size of this process (psutil), sampled by a daemon
  thread every `sample_interval_s` and at every `step_sample()`.

Two windows: `summary_after_first_step()` holds the peaks from `start()` to `mark_first_step()`
(right after the first optimizer step, while DDP still holds gradients outside its buckets), and
`summary()` the peaks from then to the end (steady state; the whole run if
`mark_first_step()` was never called).
"""

from __future__ import annotations

import threading
from typing import Any

import psutil
import torch

__all__ = ["MemoryTracker"]


def _nvml_handles(devices: list[torch.device]) -> tuple[Any, list[Any]] | None:
    """(pynvml module, one handle per device) or None where NVML cannot be used."""
    try:
        import pynvml  # nvidia-ml-py; imported lazily because only GPU machines need it

        pynvml.nvmlInit()
        handles = []
        for d in devices:
            # Match by UUID: NVML numbers all GPUs, torch only the CUDA_VISIBLE_DEVICES ones.
            uuid = str(torch.cuda.get_device_properties(d).uuid)
            handles.append(pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}"))
        return pynvml, handles
    except Exception:  # any NVML failure (no driver, MIG, old driver) just means "no NVML data"
        return None


class MemoryTracker:
    """Samples peak memory of one rank; see the module docstring for what each field means."""

    def __init__(
        self, *, rank: int, devices: list[torch.device], sample_interval_s: float = 0.05
    ) -> None:
        if sample_interval_s <= 0:
            raise ValueError(f"sample_interval_s must be > 0, got {sample_interval_s}")
        self.rank = rank
        self.devices = [torch.device(d) for d in devices] or [torch.device("cpu")]
        self.cuda_devices = [d for d in self.devices if d.type == "cuda"]
        self.sample_interval_s = sample_interval_s
        self._process = psutil.Process()
        self._nvml = _nvml_handles(self.cuda_devices) if self.cuda_devices else None
        self._lock = threading.Lock()
        self._peak_rss = 0
        self._peak_nvml: list[int | None] = [None] * len(self.cuda_devices)
        self._first_step: list[dict] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- sampling ------------------------------------------------------------------------------
    def _sample(self) -> int:
        # Read under the lock: a reading taken before _reset_peaks must not land after it.
        with self._lock:
            rss = self._process.memory_info().rss
            nvml_used = []
            if self._nvml is not None:
                pynvml, handles = self._nvml
                nvml_used = [int(pynvml.nvmlDeviceGetMemoryInfo(h).used) for h in handles]
            self._peak_rss = max(self._peak_rss, rss)
            for i, used in enumerate(nvml_used):
                prev = self._peak_nvml[i]
                self._peak_nvml[i] = used if prev is None else max(prev, used)
        return rss

    def _run(self) -> None:
        while not self._stop.wait(self.sample_interval_s):
            self._sample()

    def _reset_peaks(self) -> None:
        for d in self.cuda_devices:
            torch.cuda.reset_peak_memory_stats(d)
        with self._lock:
            self._peak_rss = 0
            self._peak_nvml = [None] * len(self.cuda_devices)
        self._sample()

    def start(self) -> None:
        """Reset the peaks and start the background sampler (a daemon thread). Idempotent."""
        if self._thread is not None:
            return
        self._reset_peaks()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"rss-sampler-{self.rank}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Take a last sample and stop the sampler. Idempotent."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._sample()

    def step_sample(self) -> dict:
        """Cheap per-step reading for steps.csv: `{"rss_bytes", "cuda_allocated_bytes"}`.

        `cuda_allocated_bytes` is the current allocation on the rank's first CUDA device (GPU 0
        for DataParallel, where the imbalance sits); None without CUDA.
        """
        rss = self._sample()
        allocated = (
            int(torch.cuda.memory_allocated(self.cuda_devices[0])) if self.cuda_devices else None
        )
        return {"rss_bytes": int(rss), "cuda_allocated_bytes": allocated}

    # -- results -------------------------------------------------------------------------------
    def _entries(self) -> list[dict]:
        self._sample()
        with self._lock:
            peak_rss, peak_nvml = self._peak_rss, list(self._peak_nvml)
        entries = []
        cuda_index = 0
        for d in self.devices:
            entry = {
                "rank": self.rank,
                "device": str(d),
                "peak_allocated_bytes": None,
                "peak_reserved_bytes": None,
                "nvml_used_bytes": None,
                "peak_rss_bytes": int(peak_rss),
            }
            if d.type == "cuda":
                entry["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(d))
                entry["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved(d))
                entry["nvml_used_bytes"] = peak_nvml[cuda_index]
                cuda_index += 1
            entries.append(entry)
        return entries

    def mark_first_step(self) -> None:
        """Snapshot the peaks right after the first optimizer step, then reset them."""
        self._first_step = self._entries()
        self._reset_peaks()

    def summary(self) -> list[dict]:
        """run.json `metrics.memory` entries of this rank, one per device (see module docstring)."""
        return self._entries()

    def summary_after_first_step(self) -> list[dict]:
        """run.json `metrics.memory_after_first_step` entries; [] if no first step was marked."""
        return list(self._first_step or [])
