"""torch's flight-recorder dumps in a run folder's logs/, read without trusting them.

torch's flight recorder keeps each rank's last collectives (TORCH_FR_BUFFER_SIZE, 2000 by
default in torch 2.14, gloo and NCCL alike): per entry the process group, its sequence number
(`collective_seq_id`, the same on every rank for the same collective), the op
(`profiling_name`, e.g. `gloo:all_reduce`), input/output sizes and dtypes, when it was created
and whether it completed. Two kinds of dump land in logs/:

- `rank<r>.flightrec.json`, written by dpscope's ranks (workloads.launch.flightrec) on a
  collective error or at the watchdog's request: {"kind": "dpscope flight recorder dump",
  run_id, attempt, rank, world_size, host, pid, reason, dumped_at (epoch s), trace: torch's
  `_dump_fr_trace_json()`}.
- `nccl_trace_rank_<r>`, the pickle NCCL's own watchdog writes on a timeout
  (TORCH_NCCL_DUMP_ON_TIMEOUT). dpscope never unpickles code: a restricted unpickler builds only
  dicts, lists, tuples, strings, numbers, booleans and None, and refuses anything else.

A file that cannot be read (truncated, not a dump, too large, another job's, another rank's
name) costs one line in `problems`, never the diagnosis.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DUMP_KIND",
    "FR_REQUEST",
    "NCCL_DUMP_PREFIX",
    "Dump",
    "Entry",
    "decode_dump",
    "dump_name",
    "read_dumps",
]

DUMP_KIND = "dpscope flight recorder dump"
FR_REQUEST = "flightrec.request"
"""logs/ file whose appearance (or new mtime) asks every rank of the folder to dump."""
NCCL_DUMP_PREFIX = "nccl_trace_rank_"
MAX_DUMP_BYTES = 256 * 2**20
"""A dump of 2000 entries with stack traces is a few MB; beyond this it is not one."""
_DPSCOPE_RE = re.compile(r"rank(\d+)\.flightrec\.json")
_NCCL_RE = re.compile(re.escape(NCCL_DUMP_PREFIX) + r"(\d+)")


def dump_name(rank: int) -> str:
    """logs/ name of dpscope's dump of `rank`."""
    return f"rank{rank}.flightrec.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One collective of one rank's flight recorder."""

    pg: str
    """The process group's name (sequence numbers count per group)."""
    seq: int
    op: str
    """The op without its backend prefix (`all_reduce` for `gloo:all_reduce`)."""
    input_sizes: list
    output_sizes: list
    dtypes: list
    completed: bool
    created_ns: int | None
    """When the rank entered it (epoch ns, the rank's host clock)."""


@dataclass(kw_only=True)
class Dump:
    """One rank's dump."""

    rank: int
    file: str
    entries: list[Entry]
    dumped_at: float | None = None
    """Epoch s when dpscope's rank wrote it (None in torch's own dumps: the file's mtime)."""
    reason: str | None = None
    pg_ranks: dict[str, list[int]] = field(default_factory=dict)


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain containers and scalars only: every global (a class, a function) is refused,
    so unpickling cannot run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"holds a {module}.{name} object, not plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("holds a persistent reference, not plain data")


def decode_dump(data: bytes) -> dict:
    """A dump's top-level dict, from JSON or a plain-data pickle; ValueError (one line) if the
    bytes are neither."""
    if data[:1] in (b"{", b" ", b"\n"):
        try:
            value = json.loads(data)
        except (ValueError, RecursionError) as err:
            raise ValueError(f"not valid JSON ({str(err)[:80]})") from None
    else:
        try:
            value = _PlainUnpickler(io.BytesIO(data)).load()
        except (
            pickle.UnpicklingError,
            EOFError,
            ValueError,
            TypeError,
            IndexError,
            KeyError,
            AttributeError,
            RecursionError,
            MemoryError,
            OverflowError,
        ) as err:
            raise ValueError(f"truncated or not a plain-data pickle ({str(err)[:80]})") from None
    if not isinstance(value, dict):
        raise ValueError("not a flight-recorder dump (no top-level object)")
    return value


def _entry(raw: Any) -> Entry | None:
    """An Entry from one raw entry; None for p2p ops and entries of the wrong shape."""
    if not isinstance(raw, dict) or raw.get("is_p2p"):
        return None
    seq, name, pg = (
        raw.get("collective_seq_id"),
        raw.get("profiling_name"),
        raw.get("process_group"),
    )
    if type(seq) is not int or seq < 1 or not isinstance(name, str):
        return None
    created = raw.get("time_created_ns")
    return Entry(
        pg=str(pg[0]) if isinstance(pg, list | tuple) and pg else "0",
        seq=seq,
        op=name.split(":", 1)[-1],
        input_sizes=raw.get("input_sizes") if isinstance(raw.get("input_sizes"), list) else [],
        output_sizes=raw.get("output_sizes") if isinstance(raw.get("output_sizes"), list) else [],
        dtypes=raw.get("input_dtypes") if isinstance(raw.get("input_dtypes"), list) else [],
        completed=raw.get("retired") is True or raw.get("state") == "completed",
        created_ns=created if type(created) is int and created > 0 else None,
    )


def _pg_ranks(trace: dict) -> dict[str, list[int]]:
    """{group name: its global ranks} from pg_config (ranks are a JSON list as a string)."""
    out: dict[str, list[int]] = {}
    config = trace.get("pg_config")
    for key, pg in config.items() if isinstance(config, dict) else ():
        try:
            ranks = json.loads(pg["ranks"]) if isinstance(pg.get("ranks"), str) else pg["ranks"]
            out[str(pg.get("name") or key)] = [int(r) for r in ranks]
        except (TypeError, ValueError, KeyError, AttributeError):
            continue
    return out


def _read_one(
    path: Path, rank: int, dpscope: bool, run_id: str | None, since: float | None
) -> Dump:
    """One file as a Dump; ValueError (one line, without the file name) when it is not usable."""
    if path.stat().st_size > MAX_DUMP_BYTES:
        raise ValueError(f"over {MAX_DUMP_BYTES >> 20} MiB, not a flight-recorder dump")
    doc = decode_dump(path.read_bytes())
    meta: dict = {}
    if dpscope:
        if doc.get("kind") != DUMP_KIND or not isinstance(doc.get("trace"), dict):
            raise ValueError("not a dpscope flight-recorder dump")
        if run_id is not None and doc.get("run_id") != run_id:
            raise ValueError(f"from another job (run_id {str(doc.get('run_id'))[:60]!r})")
        if doc.get("rank") != rank:
            raise ValueError(f"says rank {str(doc.get('rank'))[:20]} but is named rank {rank}")
        meta = {"dumped_at": doc.get("dumped_at"), "reason": doc.get("reason")}
        doc = doc["trace"]
    elif since is not None and path.stat().st_mtime < since:
        raise ValueError("older than this run, so from another job")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise ValueError("has no `entries` list")
    parsed = [e for e in map(_entry, entries) if e is not None]
    at = meta.get("dumped_at")
    return Dump(
        rank=rank,
        file=path.name,
        entries=parsed,
        dumped_at=float(at) if isinstance(at, int | float) else path.stat().st_mtime,
        reason=meta.get("reason") if isinstance(meta.get("reason"), str) else None,
        pg_ranks=_pg_ranks(doc),
    )


def read_dumps(
    logs: Path, *, run_id: str | None = None, since: float | None = None
) -> tuple[dict[int, Dump], list[str]]:
    """Every usable dump in `logs` ({rank: Dump}, dpscope's own preferred over torch's) and one
    line per file that is not (`run_id`: the run's; `since`: epoch s the run started, which
    torch's dumps, carrying no run id, must be newer than)."""
    dumps: dict[int, Dump] = {}
    problems: list[str] = []
    files = sorted(Path(logs).glob("*")) if Path(logs).is_dir() else []
    for dpscope, pattern in ((True, _DPSCOPE_RE), (False, _NCCL_RE)):
        for path in files:
            m = pattern.fullmatch(path.name)
            if not m or int(m.group(1)) in dumps:
                continue
            try:
                dumps[int(m.group(1))] = _read_one(path, int(m.group(1)), dpscope, run_id, since)
            except (OSError, ValueError) as err:
                problems.append(f"logs/{path.name}: {err} — ignored")
    return dumps, problems
