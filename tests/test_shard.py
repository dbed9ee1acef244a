"""Issue 8: `analysis traces DIR --shard K/N` + `analysis merge` give exactly the unsharded
traces JSON on real multi-rank trace sets; bad shards and mismatched parts are one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from analysis.cli.main import main as analysis_main
from analysis.trace.folder import analyze_trace_dir
from analysis.trace.shard import analyze_shard, merge_parts, parse_shard
from bench.analysis import build_trace_set
from profiler.runfolder.errors import InputError
from tests.conftest import DATA, in_process

TRACE_FILTER = DATA / "hta" / "trace_filter"


def cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m analysis ARGS --no-progress`, run in this process (in_process)."""
    return in_process(analysis_main, [*args, "--no-progress"])


def _parts(trace_dir: Path, n: int, out: Path) -> list[Path]:
    paths = []
    for k in range(n):
        path = out / f"part-{k}.json"
        part = analyze_shard(trace_dir, f"{k}/{n}", progress=False, workers=1)
        path.write_text(json.dumps(part))
        paths.append(path)
    return paths


def test_cli_merge_equals_unsharded_on_a_real_ddp_run(ddp_mlp_run, tmp_path):
    traces = str(ddp_mlp_run / "traces")
    for k in range(2):
        proc = cli(
            "traces", traces, "--shard", f"{k}/2", "--json", str(tmp_path / f"part-{k}.json")
        )
        assert proc.returncode == 0, proc.stderr
        assert f"shard {k}/2: 1 of 2 files, 1 reduced" in proc.stdout
    merged = cli("merge", *map(str, sorted(tmp_path.glob("part-*.json"))), "--json",
                 str(tmp_path / "all.json"))  # fmt: skip
    assert merged.returncode == 0, merged.stderr
    whole = cli("traces", traces, "--json", str(tmp_path / "whole.json"))
    assert whole.returncode == 0, whole.stderr
    assert (tmp_path / "all.json").read_bytes() == (tmp_path / "whole.json").read_bytes()
    data = json.loads((tmp_path / "all.json").read_bytes())
    assert len(data["ranks"]) == 2 and data["collectives"] and len(data["stragglers"]) == 2
    assert merged.stdout.replace("all.json", "X") == whole.stdout.replace("whole.json", "X")


def test_merge_equals_unsharded_on_eight_real_ranks(tmp_path):
    """HTA's real NCCL rank trace copied to 8 ranks (each copy's rank rewritten): collectives,
    stragglers and spread across all of them, from 3 uneven shards."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    build_trace_set(ranks, 8, TRACE_FILTER / "sampled_rank-0.json.gz")
    whole = analyze_trace_dir(ranks, progress=False, workers=1)
    merged = merge_parts(_parts(ranks, 3, tmp_path))
    assert json.dumps(merged) == json.dumps(whole)
    assert len(merged["ranks"]) == 8 and len(merged["stragglers"]) == 8


def test_merge_keeps_skipped_files_of_every_shard(tmp_path):
    traces = tmp_path / "t"
    traces.mkdir()
    for f in TRACE_FILTER.iterdir():
        (traces / f.name).write_bytes(f.read_bytes())
    (traces / "zz-broken.json.gz").write_bytes(b"not gzip")
    merged = merge_parts(_parts(traces, 2, tmp_path))
    assert json.dumps(merged) == json.dumps(analyze_trace_dir(traces, progress=False))
    assert [Path(s["file"]).name for s in merged["skipped"]] == ["zz-broken.json.gz"]


def test_bad_shard_is_one_line():
    for shard in ("3/3", "1-3", "x/2", "0/0", "-1/2", ""):
        with pytest.raises(InputError, match="^--shard: .* is not K/N"):
            parse_shard(shard)
    for shard in ("3/3", "-1/2"):
        proc = cli("traces", str(TRACE_FILTER), f"--shard={shard}", "--json", "/nonexistent/p")
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(
            "python -m analysis traces: error: --shard: "
        )


def test_mismatched_parts_are_refused_naming_the_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    pa = _parts(TRACE_FILTER, 2, a)
    other = tmp_path / "other"
    other.mkdir()
    (other / "rank0.json.gz").write_bytes((TRACE_FILTER / "sampled_rank-0.json.gz").read_bytes())
    pb = _parts(other, 2, b)
    old = json.loads(pa[1].read_text())
    old["schema_version"] = 0
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps(old))
    not_part = tmp_path / "traces.json"  # a traces JSON, not a part
    not_part.write_text(json.dumps({"schema_version": 1, "ranks": []}))
    broken = json.loads(pa[1].read_text())
    del broken["summaries"][0]["instances"]  # a hand-edited part: not a rank summary any more
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(broken))
    cases = {
        "trace folder": [pa[0], pb[1]],
        "missing shards 1 of 2": [pa[0]],
        "overlapping parts: shard 0": [pa[0], pa[0], pa[1]],
        "schema version": [pa[0], stale],
        "is not a traces part": [pa[0], not_part],
        "broken rank summary": [pa[0], cut],
    }
    for what, paths in cases.items():
        with pytest.raises(InputError) as err:
            merge_parts(paths)
        assert what in str(err.value) and "\n" not in str(err.value)
        assert str(paths[-1]) in str(err.value) or str(paths[0]) in str(err.value)
    proc = cli("merge", str(pa[0]), str(pb[1]))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert str(pa[0]) in proc.stderr and str(pb[1]) in proc.stderr
