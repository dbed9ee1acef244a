"""The clock probe's exchange: every rank's clock measured against rank 0's, just before a traced
window (the record and its bounds: profiler.runfolder.clockprobe).

Why not gloo: a gloo send/recv round trip takes 110-170 µs on one 2-core host, so the bound it
gives is ±50-80 µs; a plain TCP socket's takes ~30 µs (±15 µs). Why not the traced collectives
alone: they bound the offset only as tightly as the calls are short (analysis/trace/clocks.py).

How: rank 0 listens on an ephemeral port of the address it reaches the job's rendezvous store
through (MASTER_ADDR; on a job that spans hosts, where that address is a loopback one such as
Debian's 127.0.1.1 for the host's own name, on every interface, published under its host name),
and publishes that address, the port and a random token in the store (a client of torchrun's
TCPStore: the store the process group rendezvoused in; the key names the restart attempt and the
probe's number in this process, so a restarted job never reads an old attempt's address). Each
other rank connects and sends the token and its rank; rank 0 serves one rank at a time, PINGS
round trips each, and sends the rank its bounds. Every other rank, served or not, then counts
itself done in the store, so rank 0 stops waiting as soon as every rank is served or has given
up, and at DEADLINE_S at the latest. Rank 0 accepts only connections that present the token
within HELLO_S, gives each connection CONNECTION_S in all, closes the listener when it is done,
and never decodes more than fixed-size integers. The clock is `time.time_ns()`: Kineto stamps
its CPU events on the same system clock (checked on torch 2.14.1: within 2-6 µs of a
`time.time_ns()` read around a `record_function`), so the offset measured here is the traces'.

A probe that cannot run (no store address, a listener that can't be reached, a timeout) costs
the probe, never the run: `probe_clock` returns None and the analysis falls back to the
collectives; the reason is printed once as one line.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import secrets
import socket
import struct
import sys
import time
from datetime import timedelta

import torch.distributed as dist

from profiler.runfolder.clockprobe import ClockProbe

__all__ = [
    "HELLO",
    "PINGS",
    "PONG",
    "RESULT",
    "probe_clock",
    "read_exact",
    "serve_all",
    "serve_one",
]

PINGS = 32
"""Round trips per rank: the shortest of 32 is within a few µs of the best of 256 on loopback."""
DEADLINE_S = 20.0
"""The longest rank 0 waits for the ranks to connect, and a rank for rank 0 to publish: the
ranks can be seconds apart when the probe runs before the first step (`--profile-wait 0`);
between steps they are milliseconds apart."""
HELLO_S = 1.0  # a connection must present its token within this
CONNECTION_S = 5.0  # one connection's whole exchange
_POLL_S = 0.2  # how often rank 0 looks at the done count while no rank connects
HELLO = struct.Struct("<16sI")  # token, rank
PONG = struct.Struct("<qq")  # t2, t3 (the rank's clock, ns)
RESULT = struct.Struct("<qqI")  # low, high (ns), pings
_probes_run = 0  # probes this process has run: the same count on every rank of the job


def probe_clock(tag: str, *, pings: int = PINGS) -> ClockProbe | None:
    """This rank's ClockProbe against rank 0 (rank 0's own: [0, 0]); `tag` names this probe in
    the store (the same on every rank). None, with one line on stderr, when it cannot run; in a
    job of one process, None silently."""
    global _probes_run
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    if pings < 1:
        raise ValueError(f"pings must be >= 1; got {pings}")
    rank, world = dist.get_rank(), dist.get_world_size()
    _probes_run += 1
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    key = f"dpscope/clock_probe/{attempt}/{_probes_run}/{tag}"
    store = None
    try:
        store = _store()
        if rank == 0:
            return _serve(store, key, world, pings)
        return _ask(store, key, rank)
    except (OSError, RuntimeError, ValueError, OverflowError, struct.error) as err:
        # RuntimeError: torch's store errors (DistError and its kinds); OSError: sockets, timeouts.
        what = " ".join(str(err).split())[:160] or type(err).__name__
        print(f"[rank{rank}] dpscope: clock probe skipped ({what})", file=sys.stderr, flush=True)
        return None
    finally:
        if store is not None and rank != 0:
            _count_done(store, key)


def _count_done(store: dist.Store, key: str) -> None:
    """Tell rank 0 this rank is done with the probe, served or not."""
    with contextlib.suppress(RuntimeError):  # the store is gone: rank 0 stops at its deadline
        store.add(f"{key}/done", 1)


def _done(store: dist.Store, key: str) -> int:
    """How many ranks are done with the probe (0 when the store cannot say)."""
    try:
        return store.add(f"{key}/done", 0)
    except RuntimeError:
        return 0


def _store() -> dist.Store:
    """A client of the job's rendezvous store (torchrun's MASTER_ADDR:MASTER_PORT)."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        raise ValueError("MASTER_ADDR/MASTER_PORT not set: not launched by torchrun")
    return dist.TCPStore(
        host, int(port), is_master=False, timeout=timedelta(seconds=DEADLINE_S),
        wait_for_workers=False,
    )  # fmt: skip


def _listen_address(master: str) -> tuple[socket.AddressFamily, str, str]:
    """(family, address to bind, address to publish) for rank 0's listener: the interface that
    routes to `master` (a UDP connect sends nothing), where the ranks that reach the store can
    reach rank 0; on a job across hosts whose route is a loopback address (the host's own name
    mapped to 127.0.1.1), every interface, published under the host's name."""
    family, _, _, _, addr = socket.getaddrinfo(master, None, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as udp:
        udp.connect((addr[0], 9))
        host = udp.getsockname()[0]
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    spans_hosts = 0 < local < dist.get_world_size()
    if spans_hosts and ipaddress.ip_address(host.split("%")[0]).is_loopback:
        return family, "", socket.gethostname()
    return family, host, host


def _serve(store: dist.Store, key: str, world: int, pings: int) -> ClockProbe:
    probe_id = secrets.token_hex(8)
    try:
        family, bind, host = _listen_address(os.environ["MASTER_ADDR"])
        server = socket.create_server((bind, 0), family=family, backlog=min(world, 4096))
    except (OSError, ValueError) as err:
        store.set(key, "none")  # the other ranks skip at once instead of waiting
        raise OSError(f"rank 0 cannot listen: {err}") from None
    token = secrets.token_bytes(16)
    with server:
        store.set(key, f"{host} {server.getsockname()[1]} {token.hex()} {probe_id}")
        served = serve_all(server, store, key, token, world, pings)
    with contextlib.suppress(RuntimeError):  # a store gone now costs nothing: the probe is done
        store.delete_key(key)
    if len(served) < world - 1:
        missing = sorted(set(range(1, world)) - served)
        print(f"[rank0] dpscope: clock probe got no reply from ranks {missing[:8]}",
              file=sys.stderr, flush=True)  # fmt: skip
    return ClockProbe(
        reference_rank=0, offset_us_low=0.0, offset_us_high=0.0, pings=0, probe_id=probe_id
    )


def serve_all(
    server: socket.socket, store: dist.Store, key: str, token: bytes, world: int, pings: int
) -> set[int]:
    """Serve connecting ranks until every rank is served or done, or the deadline passes."""
    deadline = time.monotonic() + DEADLINE_S
    served: set[int] = set()
    while len(served) < world - 1 and (left := deadline - time.monotonic()) > 0:
        server.settimeout(min(left, _POLL_S))
        try:
            conn, _ = server.accept()
        except TimeoutError:
            if _done(store, key) >= world - 1:
                break  # every other rank is done, served or given up
            continue
        with conn:
            if (rank := serve_one(conn, token, world, pings, deadline)) is not None:
                served.add(rank)
    return served


def serve_one(
    conn: socket.socket, token: bytes, world: int, pings: int, deadline: float | None = None
) -> int | None:
    """Ping one connected rank; its rank, or None for a connection without the token (within
    HELLO_S) or one that does not finish within CONNECTION_S (or the monotonic `deadline`)."""
    end = time.monotonic() + CONNECTION_S
    if deadline is not None:
        end = min(end, deadline + CONNECTION_S)
    with contextlib.suppress(OSError):  # not TCP (a test's socket pair): only latency is lost
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        hello = read_exact(conn, HELLO.size, min(end, time.monotonic() + HELLO_S))
        their_token, rank = HELLO.unpack(hello)
        if not hmac.compare_digest(their_token, token) or not 0 < rank < world:
            return None
        low, high = -(1 << 62), 1 << 62
        for _ in range(pings):
            t1 = time.time_ns()
            conn.sendall(b"p")
            t2, t3 = PONG.unpack(read_exact(conn, PONG.size, end))
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
    if not 0 < int(port) < 65536:
        raise ValueError(f"port {port} in the store is not a port")
    end = time.monotonic() + DEADLINE_S + CONNECTION_S
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(HELLO.pack(bytes.fromhex(token), rank))
        while (cmd := read_exact(conn, 1, end)) == b"p":
            t2 = time.time_ns()
            conn.sendall(PONG.pack(t2, time.time_ns()))
        if cmd != b"r":
            raise OSError(f"rank 0 sent {cmd!r}, not a ping or a result")
        low, high, pings = RESULT.unpack(read_exact(conn, RESULT.size, end))
    return ClockProbe(
        reference_rank=0,
        offset_us_low=low / 1000,
        offset_us_high=high / 1000,
        pings=pings,
        probe_id=probe_id,
    )


def read_exact(conn: socket.socket, n: int, end: float) -> bytes:
    """Exactly `n` bytes by the monotonic time `end`; a closed connection or a late one is an
    OSError (a slow sender cannot stretch the wait by trickling bytes)."""
    buf = bytearray()
    while len(buf) < n:
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the other side was too slow")
        conn.settimeout(left)
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise OSError("the connection closed mid-probe")
        buf += chunk
    return bytes(buf)
