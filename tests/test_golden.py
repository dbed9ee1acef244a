"""The committed golden run set (tests/data/golden/, made by `make golden`) keeps today's run-folder
format: each folder is made again now by the real launcher with the same settings, and both
copies must pass the typed readers and have the same shape: the same files, the same run.json keys
(recursively, wherever both hold an object), the same schema versions and the same steps.csv and
comm.csv columns. A change of the format fails here, saying to run `make golden`."""

from __future__ import annotations

import csv
import gzip
import re
from pathlib import Path

import pytest

from bench import golden
from profiler.runfolder.commcsv import read_comm_csv
from profiler.runfolder.steps import read_steps
from tests.conftest import FRESH_EXTRA, GOLDEN, read_run

FIX = "run `make golden` and commit tests/data/golden/"
TRACE_ID = re.compile(r"\.\d+\.pt\.trace\.json")
CHECKPOINT = "checkpoint.pt"  # the fresh training runs' --checkpoint (FRESH_EXTRA), not golden


def files(folder: Path) -> set[str]:
    """The folder's files, relative, with each trace's time stamp id as `*`. A rank's error file
    is left out for every rank but the one that failed: whether a rank stopped by torchrun got
    to write one first is a race, not the format."""
    failed = (read_run(folder).get("error") or {}).get("rank")
    out = set()
    for path in folder.rglob("*"):
        rel = path.relative_to(folder).as_posix()
        error_file = re.fullmatch(r"logs/rank(\d+)\.error\.json", rel)
        if not path.is_file() or rel == CHECKPOINT or (error_file and int(error_file[1]) != failed):
            continue
        out.add(TRACE_ID.sub(".*.pt.trace.json", rel))
    return out


def key_differences(want: object, got: object, path: str = "run.json") -> list[str]:
    """Where the keys of two records differ, wherever both hold an object (lists element by
    element); values are data, except every `schema_version`, which must be equal."""
    out: list[str] = []
    if isinstance(want, dict) and isinstance(got, dict):
        out += [f"{path}.{k} only in the golden folder" for k in sorted(want.keys() - got.keys())]
        out += [f"{path}.{k} only in a run made now" for k in sorted(got.keys() - want.keys())]
        for key in sorted(want.keys() & got.keys()):
            if key.endswith("schema_version") and want[key] != got[key]:
                out.append(f"{path}.{key}: golden {want[key]!r}, now {got[key]!r}")
            out += key_differences(want[key], got[key], f"{path}.{key}")
    elif isinstance(want, list) and isinstance(got, list):
        for i, (a, b) in enumerate(zip(want, got, strict=False)):
            out += key_differences(a, b, f"{path}[{i}]")
    return out


def header(path: Path) -> list[str] | None:
    if not path.is_file():
        return None
    with open(path, newline="", encoding="utf-8") as f:
        return next(csv.reader(f), [])


def read_typed(folder: Path) -> dict:
    """run.json through the typed reader (read_run), steps.csv and comm.csv through theirs."""
    record = read_run(folder)
    if (folder / "steps.csv").is_file():
        assert read_steps(folder / "steps.csv"), f"{folder}: steps.csv has no rows"
    if (folder / "comm.csv").is_file():
        assert len(read_comm_csv(folder / "comm.csv", world_size=2)) > 0
    return record


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(golden.GOLDEN_RUNS))
def test_the_golden_folder_has_todays_format(name: str, fresh_golden) -> None:
    committed, fresh = GOLDEN / name, fresh_golden(name)
    stale = f"tests/data/golden/{name} no longer matches the run folders dpscope writes: {FIX}"
    want, got = read_typed(committed), read_typed(fresh)
    want_files, got_files = files(committed), files(fresh)
    assert want_files == got_files, (
        f"{stale} (files only in the golden folder: {sorted(want_files - got_files)}; "
        f"only in a run made now: {sorted(got_files - want_files)})"
    )
    assert not (diff := key_differences(want, got)), f"{stale}: " + "; ".join(diff)
    for table in ("steps.csv", "comm.csv"):
        assert header(committed / table) == header(fresh / table), f"{stale} ({table} columns)"
    if name in FRESH_EXTRA:
        assert (fresh / CHECKPOINT).is_file()  # the one file it has beyond the golden one


def test_the_golden_set_is_small_and_carries_no_machine_paths() -> None:
    """Under 2 MB in all; the run folders' text, the traces' inflated JSON included, keeps no
    path of the machine that made them (`make golden` writes `runs`, `dpscope`, `python`, `tmp`
    for them)."""
    paths = [p for p in GOLDEN.rglob("*") if p.is_file()]
    assert {p.relative_to(GOLDEN).parts[0] for p in paths} == set(golden.GOLDEN_RUNS)
    assert sum(p.stat().st_size for p in paths) < 2_000_000
    machine = [m for m, _ in golden.machine_paths(GOLDEN)]  # this checkout, python, home
    for path in paths:
        if path.name.endswith(".json.gz"):
            text = gzip.decompress(path.read_bytes()).decode("utf-8")
        elif path.suffix in (".json", ".log", ".txt", ".csv", ".request"):
            text = path.read_text(encoding="utf-8")
        else:
            continue
        assert not [m for m in machine if m in text], (path, [m for m in machine if m in text])
