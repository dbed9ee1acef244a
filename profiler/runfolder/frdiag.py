"""What the ranks' flight-recorder dumps say about a failed run: the first collective where the
ranks disagree (run.json `error.flight_recorder`, docs/reference/run-folder.md).

Every rank numbers the collectives of a process group in the same order, so sequence number k
is the same collective on every rank. Walking k up from the oldest number every dump still
holds (the buffer is a ring), the first k where the dumped ranks of the group disagree is:

- a **hang** when some ranks have entry k and others never reached it (their last entry is
  older): "rank 1 never entered all_reduce #5 (rank 0 waited 3.0 s)", the wait being the dump
  time minus the time the rank entered k;
- a **desync** when the ranks that entered k used different ops, sizes or dtypes: each rank's
  op, input sizes and dtypes are listed.

Ranks with no dump are named (`no_dump`), as are the dump files that could not be read.
"""

from __future__ import annotations

from collections import Counter

from profiler.runfolder.flightrec import Dump, Entry

__all__ = ["diagnose_dumps", "ranks_text", "used"]

_SIZES_CHARS = 60  # one rank's sizes in the message; the record keeps them whole


def used(rank: int, e: Entry) -> dict:
    """One rank's entry of `desync`: what it entered the collective with."""
    return {
        "rank": rank,
        "op": e.op,
        "input_sizes": e.input_sizes,
        "output_sizes": e.output_sizes,
        "dtypes": e.dtypes,
    }


def ranks_text(ranks: list[int]) -> str:
    """'rank 1' or 'ranks 0, 2, 3'."""
    return f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, sorted(ranks)))}"


def _fingerprint(e: Entry) -> tuple:
    return (e.op, repr(e.input_sizes), repr(e.output_sizes), repr(e.dtypes))


def _first_disagreement(
    by_rank: dict[int, dict[int, Entry]],
) -> tuple[int, dict[int, Entry]] | None:
    """(k, {rank: entry k}) of the first sequence number where the ranks disagree, else None."""
    used = [entries for entries in by_rank.values() if entries]
    if not used:
        return None
    lo, hi = max(min(e) for e in used), max(max(e) for e in used)  # the ring's common span
    for k in range(lo, hi + 1):
        have = {r: entries[k] for r, entries in by_rank.items() if k in entries}
        if len(have) < len(by_rank) or len({_fingerprint(e) for e in have.values()}) > 1:
            return k, have
    return None


def _groups(dumps: dict[int, Dump]) -> dict[str, dict[int, dict[int, Entry]]]:
    """{process group: {rank: {seq: entry}}} over the ranks that belong to the group."""
    out: dict[str, dict[int, dict[int, Entry]]] = {}
    for rank, dump in dumps.items():
        for e in dump.entries:
            out.setdefault(e.pg, {}).setdefault(rank, {})[e.seq] = e
    for pg, by_rank in out.items():
        members = next((d.pg_ranks[pg] for d in dumps.values() if pg in d.pg_ranks), None)
        for rank in dumps:
            if (members is None or rank in members) and rank not in by_rank:
                by_rank[rank] = {}  # a member that never used the group disagrees at once
    return out


def _waited(dumps: dict[int, Dump], have: dict[int, Entry], *, failed: bool) -> dict[int, float]:
    """Seconds each rank had been inside its entry when it dumped: entries not completed, and
    with `failed` (some ranks never entered it, so it cannot have succeeded) completed ones
    too: they ended in the error the rank dumped right after."""
    out = {}
    for r, e in have.items():
        at = dumps[r].dumped_at
        if (failed or not e.completed) and e.created_ns is not None and at is not None:
            out[r] = round(max(0.0, at - e.created_ns / 1e9), 1)
    return out


def _sizes(e: Entry) -> str:
    text = f"{e.input_sizes}"
    return text if len(text) <= _SIZES_CHARS else text[: _SIZES_CHARS - 1] + "…"


def _message(k: int, op: str, have: dict[int, Entry], never: list[int], waited: dict) -> str:
    if never:
        text = f"{ranks_text(never)} never entered {op} #{k}"
        if waited:
            text += f" ({ranks_text(list(waited))} waited {max(waited.values()):.0f} s)"
        elif have:
            text += f" ({ranks_text(list(have))} entered it)"
        return text
    used = ", ".join(
        f"rank {r} {e.op} {_sizes(e)} {'/'.join(map(str, e.dtypes))}"
        for r, e in sorted(have.items())
    )
    return f"the ranks disagree at collective #{k}: {used}"


def _agreed(dumps: dict[int, Dump], *, no_dump: list[int]) -> dict:
    """The fields when the dumped ranks agree on every collective: their last one (the default
    group's), with what they used and who had not completed it. A rank with no dump may have
    died in it."""
    last = {
        r: max(d.entries, key=lambda e: (e.pg == "0", e.seq)) for r, d in dumps.items() if d.entries
    }
    fields = {
        "process_group": None,
        "seq": None,
        "collective": None,
        "entered": sorted(last),
        "never_entered": [],
        "waited_s": {},
        "desync": None,
    }
    if not last:
        return {**fields, "message": "the flight recorder holds no collective"}
    e = last[min(last, key=lambda r: (-last[r].seq, r))]  # the furthest rank's
    pending = {r: x for r, x in last.items() if x.seq == e.seq and not x.completed}
    waited = _waited(dumps, pending, failed=bool(no_dump))
    same = sorted(r for r, x in last.items() if x.seq == e.seq)
    text = f"{ranks_text(same)} last entered {e.op} #{e.seq} with input sizes {_sizes(e)}"
    text += f" ({'/'.join(map(str, e.dtypes))})" if e.dtypes else ""
    if waited:
        text += f"; {ranks_text(list(waited))} waited {max(waited.values()):.0f} s in it"
    elif pending:
        text += f"; {ranks_text(list(pending))} had not completed it"
    return {
        **fields,
        "process_group": e.pg,
        "seq": e.seq,
        "collective": e.op,
        "entered": same,
        "waited_s": {str(r): w for r, w in sorted(waited.items())},
        "message": text,
    }


def diagnose_dumps(
    dumps: dict[int, Dump], *, world_size: int | None, problems: list[str]
) -> dict | None:
    """run.json `error.flight_recorder` from the ranks' dumps (None without any dump)."""
    problems, dumps = list(problems), dict(dumps)
    for r in [r for r in dumps if world_size and r >= world_size]:
        problems.append(
            f"logs/{dumps.pop(r).file}: rank {r} is outside the world of {world_size}"
            " ranks, so from another job — ignored"
        )
    if not dumps:
        return None
    expected = range(world_size) if world_size else sorted(dumps)
    no_dump = [r for r in expected if r not in dumps]
    if no_dump:
        logs = ", ".join(f"logs/rank{r}.log" for r in no_dump[:4])
        problems.append(
            f"no dump from {ranks_text(no_dump)} (it died before it could dump, or "
            f"wrote elsewhere: see {logs})"
        )
    found = []
    for pg, by_rank in _groups(dumps).items():
        hit = _first_disagreement(by_rank)
        if hit is not None:
            k, have = hit
            first = min((e.created_ns or 0) for e in have.values()) if have else 0
            found.append((pg != "0", first, pg, k, have, sorted(set(by_rank) - set(have))))
    out = {
        "no_dump": no_dump,
        "dumps": sorted(d.file for d in dumps.values()),
        "problems": problems,
    }
    if not found:
        return {**out, **_agreed(dumps, no_dump=no_dump)}
    _, _, pg, k, have, never = min(found, key=lambda f: f[:2])
    op = Counter(e.op for e in have.values()).most_common(1)[0][0] if have else "collective"
    waited = _waited(dumps, have, failed=bool(never))
    desync = [used(r, e) for r, e in sorted(have.items())] if not never else None
    return {
        **out,
        "process_group": pg,
        "seq": k,
        "collective": op,
        "entered": sorted(have),
        "never_entered": never,
        "waited_s": {str(r): s for r, s in sorted(waited.items())},
        "desync": desync,
        "message": _message(k, op, have, never, waited),
    }
