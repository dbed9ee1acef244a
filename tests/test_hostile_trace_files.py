"""Hostile trace files v2 (issue 25 B): files that are not files, decompression bombs, and
traces that disagree with their run's run.json. Each case costs one line, never a hang, a
traceback or a silent number.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from analysis.runs.compare import compare_runs
from analysis.trace.inflate import max_ratio, max_trace_bytes
from profiler.runfolder.errors import InputError
from tests.conftest import REPO
from tests.hostile_common import ddp_traces  # noqa: F401  (fixture)

# --- class 6: decompression bombs and files that are not files -------------------------------

_BOMB_CHILD = """
import json, resource, sys
from analysis.trace.folder import analyze_trace_dir
from profiler.runfolder.errors import InputError
try:
    r = analyze_trace_dir(sys.argv[1], workers=1, progress=False)
    print(json.dumps({"skipped": r["skipped"]}))
except InputError as err:
    print(json.dumps({"error": str(err)}))
# VmHWM, not ru_maxrss: after fork+exec ru_maxrss keeps the parent's (pytest's) peak.
try:
    hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM"))
    rss_mb = int(hwm.split()[1]) // 1024
except OSError:
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(json.dumps({"rss_mb": rss_mb}))
"""


def _gzip_stream(path, head: bytes, block: bytes, blocks: int, tail: bytes = b"") -> None:
    """A gzip of head + block×blocks + tail, written without holding the inflated text."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    with path.open("wb") as f:
        f.write(c.compress(head))
        for _ in range(blocks):
            f.write(c.compress(block))
        f.write(c.compress(tail) + c.flush())


def _run_child(folder, cap: int | None) -> list[dict]:
    env = dict(os.environ)
    if cap is not None:
        env["DPSCOPE_MAX_TRACE_BYTES"] = str(cap)
    proc = subprocess.run(
        [sys.executable, "-c", _BOMB_CHILD, str(folder)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.fixture(scope="module")
def baseline_rss_mb(tmp_path_factory) -> int:
    """The same child's peak RSS on a trace with nothing in it: the interpreter and the
    analysis's imports, measured here so a bound on a bomb's cost is a difference within one
    machine, not an absolute budget that another machine's libraries would break."""
    folder = tmp_path_factory.mktemp("empty-trace")
    (folder / "rank0.pt.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}'))
    return _run_child(folder, 32 << 20)[1]["rss_mb"]


# What reading a bomb may add to that: half the smallest bomb's inflated text (256 MiB).
BOMB_EXTRA_MB = 128

BOMBS = {  # name -> (head, block, blocks, tail): all inflate to 256 MiB or more
    "zeros": (b"", b"\0" * (1 << 20), 256, b""),
    "valid-json": (
        b'{"traceEvents": [',
        b'{"ph": "i", "name": "x", "ts": 1},' * 30_000,
        260,
        b"{}]}",
    ),
    "json-whitespace": (b'{"traceEvents": [' + b" " * 100, b" " * (1 << 20), 256, b"]}"),
}


@pytest.mark.parametrize("case", list(BOMBS))
@pytest.mark.integration
def test_decompression_bomb_is_refused_with_bounded_memory(case, tmp_path, baseline_rss_mb):
    """With the cap at 32 MiB a 256 MiB inflation stops at the cap: one `skipped` line naming
    the file and the cap's variable, and the process never holds the inflated text."""
    _gzip_stream(tmp_path / "rank0.pt.trace.json.gz", *BOMBS[case])
    assert (tmp_path / "rank0.pt.trace.json.gz").stat().st_size < 4 << 20
    out = _run_child(tmp_path, 32 << 20)
    error = out[0].get("error") or ""
    assert "rank0.pt.trace.json.gz" in error and (
        "DPSCOPE_MAX_TRACE_BYTES" in error
        or "DPSCOPE_MAX_TRACE_RATIO" in error
        or "no JSON" in error
    )
    extra = out[1]["rss_mb"] - baseline_rss_mb  # the inflated text alone would be 256 MiB
    assert extra < BOMB_EXTRA_MB, f"{extra} MB over the empty trace's {baseline_rss_mb} MB"


@pytest.mark.integration
def test_a_1mb_gzip_that_inflates_to_1gib_fails_before_inflating_it(tmp_path, baseline_rss_mb):
    """With the default caps (2 GiB of JSON) a 1 MB gzip inflating to 1 GiB was inflated and
    parsed: 61 s and 2.2 GB. The ratio cap, checked while streaming, stops it after
    RATIO_FLOOR_BYTES plus one step of output, in memory of that order."""
    from analysis.trace.inflate import INFLATE_STEP_BYTES, RATIO_FLOOR_BYTES

    member = gzip.compress(b'{"traceEvents": [' + b" " * ((1 << 20) - 20) + b"]}", 9, mtime=0)
    path = tmp_path / "rank0.pt.trace.json.gz"
    path.write_bytes(member * 1024)  # 1024 gzip members of 1 MiB each: 1 GiB inflated
    assert path.stat().st_size < 2 << 20
    out = _run_child(tmp_path, None)
    error = out[0]["error"]
    assert "inflates to more than 200x its compressed size" in error, error
    inflated = int(error.split("bomb: ")[1].split(" bytes")[0].replace(",", ""))
    assert inflated <= RATIO_FLOOR_BYTES + INFLATE_STEP_BYTES + (1 << 20)  # never 1 GiB
    extra = out[1]["rss_mb"] - baseline_rss_mb  # about that much over the interpreter's
    assert extra < BOMB_EXTRA_MB, f"{extra} MB over the empty trace's {baseline_rss_mb} MB"


def test_the_size_cap_applies_to_plain_json_too(tmp_path, ddp_traces):  # noqa: F811
    r1 = ddp_traces[1]
    (tmp_path / "rank1.pt.trace.json").write_bytes(gzip.decompress(r1.read_bytes()))
    out = _run_child(tmp_path, 10_000)
    assert "holds more than 10,000 bytes" in out[0]["error"]
    assert "traceEvents" not in out[0]["error"]


def test_a_bad_cap_is_one_line(tmp_path, ddp_traces):  # noqa: F811
    shutil.copy(ddp_traces[0], tmp_path / ddp_traces[0].name)
    out = _run_child(tmp_path, "lots")  # type: ignore[arg-type]
    assert "DPSCOPE_MAX_TRACE_BYTES" in out[0]["error"] and "'lots'" in out[0]["error"]


@pytest.mark.parametrize("kind", ["fifo", "fifo-as-the-path"])
def test_a_fifo_named_like_a_trace_is_skipped_not_waited_on(kind, tmp_path, ddp_traces):  # noqa: F811
    shutil.copy(ddp_traces[0], tmp_path / ddp_traces[0].name)
    fifo = tmp_path / "rank1.pt.trace.json"
    os.mkfifo(fifo)
    out = _run_child(fifo if kind == "fifo-as-the-path" else tmp_path, None)
    text = json.dumps(out[0])
    assert "rank1.pt.trace.json" in text and "not a regular file" in text


# --- class 3: the traces of a run folder vs its run.json --------------------------------------


def _world(n: int):
    def edit(run: Path) -> None:
        rec = json.loads((run / "run.json").read_text())
        rec["config"]["world_size"] = n
        (run / "run.json").write_text(json.dumps(rec))

    return edit


def _world_1_rank_0_steps(run: Path) -> None:
    """world_size 1 in run.json and steps.csv (rank 0's rows only; a steps.csv row of a rank
    beyond world_size makes the run invalid, tests/hostile_common.py), 2 ranks in the traces."""
    _world(1)(run)
    lines = (run / "steps.csv").read_text().splitlines()
    rank = lines[0].split(",").index("rank")
    rows = [ln for ln in lines[1:] if ln.split(",")[rank] == "0"]
    (run / "steps.csv").write_text("\n".join([lines[0], *rows]) + "\n")


def _drop_rank1(run: Path) -> None:
    next((run / "traces").glob("rank1.*")).unlink()


def _rename_rank1(run: Path) -> None:
    r1 = next((run / "traces").glob("rank1.*"))
    r1.rename(r1.with_name("rank1.123.pt.trace.json.gz"))


def _symlink_rank1(run: Path) -> None:
    r1 = next((run / "traces").glob("rank1.*"))
    outside = run.parent / "elsewhere" / r1.name
    outside.parent.mkdir()
    r1.rename(outside)
    r1.symlink_to(outside)


CONSISTENCY = {  # name -> (edit of the run folder, words every expected warning holds)
    "world-8": (_world(8), ["world_size 8", "distributedInfo says world_size 2", "rank(s) 2, 3"]),
    "world-1": (_world_1_rank_0_steps, ["world_size 1", "distributedInfo says world_size 2"]),
    "missing-rank": (_drop_rank1, ["no trace for rank(s) 1"]),
    "another-runs-file": (_rename_rank1, ["rank1.123.pt.trace.json.gz: not among"]),
    "symlink-outside": (_symlink_rank1, ["a symbolic link to", "elsewhere"]),
}


@pytest.mark.parametrize("case", list(CONSISTENCY))
def test_traces_that_disagree_with_run_json_are_named(case, tmp_path, ddp_mlp_run):
    run = tmp_path / "ddp"
    shutil.copytree(ddp_mlp_run, run)
    edit, words = CONSISTENCY[case]
    edit(run)
    (entry,) = compare_runs([run], progress=False)["runs"]
    text = "\n".join(entry["warnings"])
    for w in words:
        assert w in text, (w, entry["warnings"])
    assert "run.json" in text or case in ("another-runs-file", "symlink-outside")


def test_a_consistent_run_has_no_consistency_warning(tmp_path, ddp_mlp_run):
    (entry,) = compare_runs([ddp_mlp_run], progress=False)["runs"]
    words = ("distributedInfo says", "no trace for rank", "not among", "symbolic link")
    assert not [w for w in entry["warnings"] if any(x in w for x in words)]


@pytest.mark.parametrize(
    ("var", "value"),
    [("DPSCOPE_MAX_TRACE_RATIO", v) for v in ("nan", "0.5", "lots", "")]
    + [("DPSCOPE_MAX_TRACE_BYTES", v) for v in ("0", "-1", "1e9", "lots", "")],
)
def test_a_bad_cap_is_one_line_naming_its_variable(var, value, monkeypatch):
    monkeypatch.setenv(var, value)
    cap = max_ratio if var.endswith("RATIO") else max_trace_bytes
    with pytest.raises(InputError) as err:
        cap()
    line = str(err.value)
    assert "\n" not in line and line.count(var) >= 2 and f"{value!r}" in line, line
