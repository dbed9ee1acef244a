"""The clock probe's exchange: every rank's clock measured against rank 0's, just before a traced
window (the record and its bounds: profiler.runfolder.clockprobe).

Why not gloo: a gloo send/recv round trip takes 110-170 µs on one 2-core host, so the bound it
gives is ±50-80 µs; a plain TCP socket's takes ~30 µs (±15 µs). Why not the traced collectives
alone: they bound the offset only as tightly as the calls are short (analysis/trace/clocks.py).

How: rank 0 listens on an ephemeral port of the address it reaches the job's rendezvous store
through (MASTER_ADDR), and publishes that address, the port and a random token in the store
(a client of torchrun's TCPStore: the store the process group rendezvoused in). Each other rank
connects and sends the token and its rank; rank 0 serves one rank at a time, PINGS round trips
each, and sends the rank its bounds. Rank 0 accepts only connections that present the token,
closes the listener when every rank is served or its deadline passes, and never decodes more
than fixed-size integers. The clock is `time.time_ns()`: Kineto stamps its CPU events on the
same system clock (checked on torch 2.14.1: within 2-6 µs of a `time.time_ns()` read around a
`record_function`), so the offset measured here is the traces' offset.

A probe that cannot run (no store address, a listener that can't be reached, a timeout) costs
the probe, never the run: `probe_clock` returns None and the analysis falls back to the
collectives; the reason is printed once as one line.
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import struct
import sys
import time
from datetime import timedelta

import torch.distributed as dist

from profiler.runfolder.clockprobe import ClockProbe

__all__ = ["HELLO", "PINGS", "PONG", "RESULT", "probe_clock", "read_exact", "serve_one"]

PINGS = 32
"""Round trips per rank: the shortest of 32 is within a few µs of the best of 256 on loopback."""
DEADLINE_S = 60.0
"""How long rank 0 waits for every rank to connect, and a rank for rank 0 to publish: the
ranks can be seconds apart when the probe runs before the first step (`--profile-wait 0`)."""
_SOCKET_S = 5.0  # one connection's reads and writes
HELLO = struct.Struct("<16sI")  # token, rank
PONG = struct.Struct("<qq")  # t2, t3 (the rank's clock, ns)
RESULT = struct.Struct("<qqI")  # low, high (ns), pings


def probe_clock(tag: str, *, pings: int = PINGS) -> ClockProbe | None:
    """This rank's ClockProbe against rank 0 (rank 0's own: [0, 0]); `tag` names this probe in
    the store (the same on every rank, unique per probe of the job). None, with one line on
    stderr, when it cannot run; in a job of one process, None silently."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        store = _store()
        key = f"dpscope/clock_probe/{tag}"
        if rank == 0:
            return _serve(store, key, world, pings)
        return _ask(store, key, rank)
    except (OSError, RuntimeError, ValueError, struct.error) as err:
        # RuntimeError: torch's store errors (DistStoreError is one); OSError: sockets, timeouts.
        what = " ".join(str(err).split())[:160] or type(err).__name__
        print(f"[rank{rank}] dpscope: clock probe skipped ({what})", file=sys.stderr, flush=True)
        return None


def _store() -> dist.Store:
    """A client of the job's rendezvous store (torchrun's MASTER_ADDR:MASTER_PORT)."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        raise ValueError("MASTER_ADDR/MASTER_PORT not set: not launched by torchrun")
    return dist.TCPStore(
        host, int(port), is_master=False, timeout=timedelta(seconds=DEADLINE_S),
        wait_for_workers=False,
    )  # fmt: skip


def _local_address(master: str) -> tuple[socket.AddressFamily, str]:
    """The address of this host's interface that routes to `master` (a UDP connect sends
    nothing): where the other ranks, which reach the store, can reach rank 0."""
    family, _, _, _, addr = socket.getaddrinfo(master, None, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as udp:
        udp.connect((addr[0], 9))
        return family, udp.getsockname()[0]


def _serve(store: dist.Store, key: str, world: int, pings: int) -> ClockProbe:
    probe_id = secrets.token_hex(8)
    try:
        family, host = _local_address(os.environ["MASTER_ADDR"])
        server = socket.create_server((host, 0), family=family, backlog=min(world, 4096))
    except OSError as err:
        store.set(key, "none")  # the other ranks skip at once instead of waiting
        raise OSError(f"rank 0 cannot listen: {err}") from None
    token = secrets.token_bytes(16)
    with server:
        port = server.getsockname()[1]
        store.set(key, f"{host} {port} {token.hex()} {probe_id}")
        deadline = time.monotonic() + DEADLINE_S
        served: set[int] = set()
        while len(served) < world - 1 and (left := deadline - time.monotonic()) > 0:
            server.settimeout(left)
            try:
                conn, _ = server.accept()
            except TimeoutError:
                break
            with conn:
                conn.settimeout(_SOCKET_S)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if (rank := serve_one(conn, token, world, pings)) is not None:
                    served.add(rank)
    if len(served) < world - 1:
        missing = sorted(set(range(1, world)) - served)
        print(f"[rank0] dpscope: clock probe reached no reply from ranks {missing[:8]}",
              file=sys.stderr, flush=True)  # fmt: skip
    return ClockProbe(
        reference_rank=0, offset_us_low=0.0, offset_us_high=0.0, pings=0, probe_id=probe_id
    )


def serve_one(conn: socket.socket, token: bytes, world: int, pings: int) -> int | None:
    """Ping one connected rank; its rank, or None for a connection without the token."""
    try:
        their_token, rank = HELLO.unpack(read_exact(conn, HELLO.size))
        if not hmac.compare_digest(their_token, token) or not 0 < rank < world:
            return None
        low, high = -(1 << 62), 1 << 62
        for _ in range(pings):
            t1 = time.time_ns()
            conn.sendall(b"p")
            t2, t3 = PONG.unpack(read_exact(conn, PONG.size))
            t4 = time.time_ns()
            low, high = max(low, t3 - t4), min(high, t2 - t1)
        conn.sendall(b"r" + RESULT.pack(low, high, pings))
        return rank
    except (OSError, struct.error):
        return None  # that rank's probe fails on its side too, with its own line


def _ask(store: dist.Store, key: str, rank: int) -> ClockProbe:
    value = store.get(key).decode()
    if value == "none":
        raise OSError("rank 0 could not listen")
    host, port, token, probe_id = value.split()
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(HELLO.pack(bytes.fromhex(token), rank))
        while (cmd := read_exact(conn, 1)) == b"p":
            t2 = time.time_ns()
            conn.sendall(PONG.pack(t2, time.time_ns()))
        if cmd != b"r":
            raise OSError(f"rank 0 sent {cmd!r}, not a ping or a result")
        low, high, pings = RESULT.unpack(read_exact(conn, RESULT.size))
    return ClockProbe(
        reference_rank=0,
        offset_us_low=low / 1000,
        offset_us_high=high / 1000,
        pings=pings,
        probe_id=probe_id,
    )


def read_exact(conn: socket.socket, n: int) -> bytes:
    """Exactly `n` bytes; a closed connection is an OSError."""
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise OSError("the connection closed mid-probe")
        buf += chunk
    return bytes(buf)
