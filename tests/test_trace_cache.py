"""The opt-in trace cache: a second analysis of unchanged traces reads the summaries from
`.dpscope-cache/` and gives the same JSON; nothing is written without asking; an edited trace,
a corrupt entry or a folder where the cache cannot go costs only the cache, never the answer."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import analysis.trace.cache as cache_mod
from analysis.trace.cache import CACHE_DIR, CACHE_ENV
from analysis.trace.executors import Executor
from analysis.trace.folder import analyze_trace_dir
from tests.conftest import DATA

SOURCE = DATA / "tbplugin" / "test_distributed_gloo_gpu"


def _copy(tmp_path: Path) -> Path:
    out = tmp_path / "traces"
    shutil.copytree(SOURCE, out)
    return out


def _run(folder: Path, cache: bool = True) -> str:
    ex = Executor(cache=cache)
    return json.dumps(analyze_trace_dir(folder, workers=1, progress=False, executor=ex))


def _no_decoding(monkeypatch) -> None:
    def refuse(path):
        raise AssertionError(f"{path} was decoded, not read from the cache")

    monkeypatch.setattr(cache_mod, "summarize_file", refuse)


def test_second_analysis_comes_from_the_cache(tmp_path, monkeypatch):
    folder = _copy(tmp_path)
    first = _run(folder)
    entries = sorted(p.name for p in (folder / CACHE_DIR).iterdir())
    assert entries == [f"{p.name}.parquet" for p in sorted(SOURCE.iterdir())]
    assert first == _run(folder, cache=False)
    _no_decoding(monkeypatch)
    assert _run(folder) == first


def test_nothing_is_written_unless_asked(tmp_path, monkeypatch):
    folder = _copy(tmp_path)
    monkeypatch.delenv(CACHE_ENV, raising=False)
    analyze_trace_dir(folder, workers=1, progress=False)
    assert not (folder / CACHE_DIR).exists()
    monkeypatch.setenv(CACHE_ENV, "1")  # the environment asks for every command
    analyze_trace_dir(folder, workers=1, progress=False)
    assert (folder / CACHE_DIR).is_dir()


def test_an_edited_trace_is_analysed_afresh(tmp_path):
    folder = _copy(tmp_path)
    first = _run(folder)
    trace = next(p for p in sorted(folder.iterdir()) if p.is_file())
    data = json.loads(trace.read_text())
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("name") != "gloo:all_reduce"]
    trace.write_text(json.dumps(data))
    edited = _run(folder)
    assert edited != first and edited == _run(folder, cache=False)


def test_a_corrupt_entry_is_replaced(tmp_path, monkeypatch):
    folder = _copy(tmp_path)
    first = _run(folder)
    for entry in (folder / CACHE_DIR).iterdir():
        entry.write_bytes(b"PAR1 not really")
    assert _run(folder) == first  # decoded again, entries rewritten
    _no_decoding(monkeypatch)
    assert _run(folder) == first


@pytest.mark.parametrize("blocker", ["file", "link"])
def test_a_cache_folder_that_cannot_be_used_costs_only_the_cache(tmp_path, blocker):
    folder = _copy(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if blocker == "file":
        (folder / CACHE_DIR).write_text("not a folder")
    else:
        os.symlink(elsewhere, folder / CACHE_DIR)
    assert _run(folder) == _run(folder, cache=False)
    assert not list(elsewhere.iterdir())  # never written through the link
