"""The trace folder's reduction pauses Python's automatic garbage collection while the rank
summaries pile up (each full collection walks every summary kept so far: ~25% of a 1,024-rank
analysis in one process) and gives the caller's setting back, an error included."""

from __future__ import annotations

import gc
import shutil

import pytest

from analysis.trace import folder
from tests.hostile_common import ddp_traces  # noqa: F401  (fixture)


@pytest.fixture
def collector():
    """Whether the collector was on as each summary came in; the collector on after the test."""
    seen: list[bool] = []
    real = folder.process_summaries

    def watched(*args, **kw):
        for item in real(*args, **kw):
            seen.append(gc.isenabled())
            yield item

    folder.process_summaries = watched
    try:
        yield seen
    finally:
        folder.process_summaries = real
        gc.enable()


@pytest.mark.parametrize("enabled", [True, False], ids=["collector on", "collector off"])
def test_no_collection_while_summaries_pile_up_and_the_setting_comes_back(
    enabled,
    tmp_path,
    ddp_traces,
    collector,  # noqa: F811
):
    for f in ddp_traces:
        shutil.copy(f, tmp_path / f.name)
    (gc.enable if enabled else gc.disable)()
    good, skipped = folder.reduce_files(
        folder.find_trace_files(tmp_path), workers=1, progress=False
    )
    assert len(good) == 2 and not skipped
    assert collector == [False, False] and gc.isenabled() is enabled


def test_the_setting_comes_back_after_an_error(tmp_path, monkeypatch):
    def interrupted(*_args, **_kw):
        assert not gc.isenabled()
        raise KeyboardInterrupt
        yield  # a generator, as process_summaries is

    monkeypatch.setattr(folder, "process_summaries", interrupted)
    (tmp_path / "rank0.pt.trace.json").write_text("{}")
    with pytest.raises(KeyboardInterrupt):
        folder.reduce_files(folder.find_trace_files(tmp_path), workers=1, progress=False)
    assert gc.isenabled()
