"""Keep the profiler's own log lines out of the user's terminal: a `--script` rank's stderr file
descriptor goes through a pipe whose reader moves them to `logs/rank<r>.profiler.log`.

The reader is a small process of its own (`python -m workloads.launch.kinetolog LOG`), not a
thread: a rank that dies at once (gloo's "terminate called ... Received data size doesn't match
expected size", a C++ abort) writes its last lines into the pipe and takes any thread of its
own with it, so only a reader outside it gets them to the terminal and the launcher's log. It
ignores SIGINT and SIGTERM (a Ctrl-C must not cut what the rank prints on its way out) and ends
when the pipe closes, that is when the rank and every child holding its stderr are gone.

Kineto (torch.profiler's C++ library) and c10 write straight to file descriptor 2, past Python's
`sys.stderr`, so a `sys.stderr` wrapper cannot see them. What counts as the profiler's own
(`PROFILER_LINE`): Kineto's formatted log lines (`USDT:... SyncActivityProfilerHandler.cpp:39]
profiler_start`, `ERROR:... gpuGetDeviceCount failed with code 35` on a machine without a GPU,
and the INFO/STAGE/WARNING lines of a verbose KINETO_LOG_LEVEL) and c10's note that memory was
allocated before profiling started; under torchrun each may carry torch's `[rank<r>]:` prefix. Every other byte passes through unchanged and at once
(progress bars included); only a partial line that may still become a profiler line is held,
for at most `HOLD_S`.

POSIX only (a pipe and `select`); elsewhere `start` does nothing and the lines stay where they
were.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["PROFILER_LINE", "ProfilerLogFilter", "is_profiler_line"]

PROFILER_LINE = re.compile(
    rb"^(?:\[rank\d+\]:)?(?:(?:INFO|STAGE|USDT|WARNING|ERROR|VERBOSE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ "
    rb"[\w.-]+:\d+\] "
    rb"|\[W\d{4} [\d:.]+ (?:\d+ )?CPUAllocator\.cpp:\d+\] Memory block of unknown size)"
)
"""A line the profiler writes about itself (see the module docstring)."""
_STARTS = (b"INFO:", b"STAGE:", b"USDT:", b"WARNING:", b"ERROR:", b"VERBOSE:", b"[W", b"[rank")
HOLD_S = 0.2
"""How long a partial line that may be a profiler line waits for its end."""


def is_profiler_line(line: bytes) -> bool:
    """Whether `line` (one line, without its newline) is one of the profiler's own."""
    return PROFILER_LINE.match(line) is not None


def _may_become(partial: bytes) -> bool:
    """Whether a line still without its newline can turn into a profiler line."""
    return any(partial.startswith(s) or s.startswith(partial) for s in _STARTS)


class ProfilerLogFilter:
    """Routes file descriptor `fd` (stderr) through a pipe; profiler lines go to `log_path`."""

    def __init__(self, log_path: Path, *, fd: int = 2) -> None:
        self.log_path = Path(log_path)
        self.fd = fd
        self._saved: int | None = None
        self._read: int | None = None
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Route `fd` through the pipe to the reader process (see the module docstring)."""
        if os.name != "posix" or self._proc is not None:
            return
        sys.stderr.flush()
        self._saved = os.dup(self.fd)
        read, write = os.pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "workloads.launch.kinetolog", str(self.log_path)],
            stdin=read,
            stdout=subprocess.DEVNULL,
            stderr=self._saved,
        )
        os.close(read)
        os.dup2(write, self.fd)
        os.close(write)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Put `fd` back and let the reader drain what is left (forked children that still hold
        the pipe keep it open: then it stops waiting after `timeout_s`, and the reader ends when
        they do)."""
        if self._proc is None or self._saved is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved, self.fd)  # our last reference to the pipe's writing end
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        self._proc = None

    def _pump(self) -> None:
        assert self._read is not None and self._saved is not None
        held = b""
        with open(self.log_path, "ab") as log:
            while True:
                ready, _, _ = select.select([self._read], [], [], HOLD_S if held else None)
                if not ready:  # a held partial line got no end in time: it is the user's
                    self._out(held)
                    held = b""
                    continue
                chunk = os.read(self._read, 65536)
                if not chunk:
                    break
                held = self._split(held + chunk, log)
        self._out(held)

    def _split(self, data: bytes, log) -> bytes:
        """Route the complete lines of `data`; return the partial line kept back, if any."""
        *lines, rest = data.split(b"\n")
        passed = []
        for line in lines:
            if is_profiler_line(line):
                log.write(line + b"\n")
                log.flush()
            else:
                passed.append(line + b"\n")
        if rest and not _may_become(rest):
            passed.append(rest)
            rest = b""
        self._out(b"".join(passed))
        return rest

    def _out(self, data: bytes) -> None:
        assert self._saved is not None
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._saved, view) :]
            except OSError:  # the reader went away (the launcher stopped): drop it
                return


def main(argv: list[str] | None = None) -> int:
    """The reader process: stdin is the rank's stderr pipe, stderr the terminal (the rank's
    original stderr); the profiler's lines go to the log named by the one argument."""
    (log_path,) = sys.argv[1:] if argv is None else argv
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    filt = ProfilerLogFilter(Path(log_path))
    filt._read, filt._saved = sys.stdin.fileno(), sys.stderr.fileno()
    filt._pump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
