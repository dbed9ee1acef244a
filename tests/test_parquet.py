"""Columnar results: the Parquet tables carry the traces JSON's numbers exactly; Parquet shard
parts merge to the unsharded JSON; another schema version is one line; the DuckDB queries of
docs/guides/analysis.md run over a 1,024-rank result and agree with pandas over its JSON."""

from __future__ import annotations

import json
import re

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import analysis
from analysis.cli.main import main as analysis_main
from analysis.parquet import trace_tables, write_tables
from analysis.trace.folder import (
    analyze_trace_dir,
    combine_summaries,
    find_trace_files,
    reduce_files,
)
from profiler.runfolder.errors import InputError
from profiler.runfolder.versions import PARQUET_TABLES_SCHEMA_VERSION
from tests.conftest import DATA, REPO

HTA = DATA / "hta"


@pytest.fixture(scope="module")
def result():
    """A real GPU trace with steps, ops, 1,616 collective calls and a memory timeline."""
    return analyze_trace_dir(HTA / "df_index_resolver", progress=False)


def test_tables_round_trip_the_json_numbers(result, tmp_path):
    write_tables(trace_tables(result), tmp_path)
    (rank,) = result["ranks"]
    steps = analysis.load_steps(tmp_path)
    want = pd.DataFrame(rank["per_step"])
    assert steps.drop(columns=["run_id", "rank"]).to_dict("records") == want.to_dict("records")
    assert set(steps["run_id"]) == {str(HTA / "df_index_resolver")}
    ops = analysis.load_ops(tmp_path)
    assert ops.drop(columns=["run_id", "rank"]).to_dict("records") == rank["ops"]
    memory = analysis.load_memory(tmp_path)
    for dev in rank["memory"]["devices"]:
        mine = memory[memory["device"] == dev["device"]]
        assert mine["t_us"].tolist() == dev["timeline"]["t_us"]
        assert mine["allocated_bytes"].tolist() == dev["timeline"]["allocated_bytes"]
    calls = analysis.load_collectives(tmp_path)
    for row in result["collectives_per_rank"]:  # the per-call rows sum to the JSON's totals
        mine = calls[(calls["rank"] == row["rank"]) & (calls["name"] == row["name"])]
        assert len(mine) == row["calls"] and int(mine["bytes"].sum()) == row["bytes_total"]
        assert mine["latency_us"].sum() == pytest.approx(row["latency_us_total"], rel=1e-12)
        assert mine["transfer_us"].sum() == pytest.approx(row["transfer_us_total"], rel=1e-12)
        assert mine["sync_us"].sum() == pytest.approx(row["sync_us_total"], rel=1e-12, abs=1e-9)
    assert (calls["end_us"] >= calls["start_us"]).all()


def test_another_table_schema_version_is_one_line(result, tmp_path):
    table = trace_tables(result)["steps"]
    meta = {
        **table.schema.metadata,
        b"dpscope.schema_version": b"%d" % (PARQUET_TABLES_SCHEMA_VERSION + 1),
    }
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / "steps.parquet")
    with pytest.raises(InputError) as err:
        analysis.load_steps(tmp_path)
    line = str(err.value)
    assert "steps.parquet" in line and "schema version 2" in line and "\n" not in line
    pq.write_table(pa.table({"x": [1]}), tmp_path / "ops.parquet")
    with pytest.raises(InputError, match="not the ops table"):
        analysis.load_ops(tmp_path)


def test_parquet_parts_merge_to_the_unsharded_json(tmp_path, capsys):
    folder = DATA / "tbplugin" / "test_distributed_nccl"
    whole = tmp_path / "whole.json"
    assert analysis_main(["traces", str(folder), "--no-progress", "--json", str(whole)]) == 0
    parts = [tmp_path / "part-0.parquet", tmp_path / "part-1.json"]  # Parquet and JSON mix
    for k, part in enumerate(parts):
        argv = ["traces", str(folder), "--shard", f"{k}/2", "--json", str(part), "--no-progress"]
        assert analysis_main(argv) == 0
    assert parts[0].read_bytes()[:4] == b"PAR1"
    merged = tmp_path / "merged.json"
    argv = ["merge", *map(str, parts), "--json", str(merged), "--parquet", str(tmp_path / "pq")]
    assert analysis_main([*argv, "--no-progress"]) == 0
    assert merged.read_bytes() == whole.read_bytes()
    assert len(analysis.load_collectives(tmp_path / "pq")) == 4


def test_a_parquet_part_of_another_schema_version_is_one_line(tmp_path, capsys):
    folder = DATA / "tbplugin" / "test_distributed_nccl"
    part = tmp_path / "part-0.parquet"
    assert analysis_main(["traces", str(folder), "--shard", "0/1", "--json", str(part)]) == 0
    table = pq.read_table(part)
    meta = {**table.schema.metadata, b"dpscope.schema_version": b"1"}
    pq.write_table(table.replace_schema_metadata(meta), part)
    capsys.readouterr()
    assert analysis_main(["merge", str(part), "--json", str(tmp_path / "m.json")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert str(part) in line and "schema version 1, this dpscope reads 2" in line


def _job_1024():
    """A 1,024-rank result: one real 2-step GPU trace reduced once, then 1,024 ranks of it, each
    with its own clock offset and step times (rank r runs (r mod 13) % slower), combined by the
    same cross-rank step as any traces folder."""
    (base,), _ = reduce_files(find_trace_files(HTA / "nccl_parser_config"), workers=1)
    ranks = []
    for r in range(1024):
        clone = msgspec.structs.replace(
            base,
            rank=r,
            world_size=1024,
            file=f"rank{r}.pt.trace.json.gz",
            origin_ns=base.origin_ns + 1000 * ((r * 37) % 101),
            per_step=[
                {**s, "step_time_us": s["step_time_us"] * (1 + (r % 13) / 100)}
                for s in base.per_step
            ],  # fmt: skip
            instances={n: {k: np.copy(v) for k, v in i.items()} for n, i in base.instances.items()},
        )
        ranks.append(clone)
    return combine_summaries("job1024", ranks, [])


def _doc_queries() -> list[str]:
    text = (REPO / "docs" / "guides" / "analysis.md").read_text(encoding="utf-8")
    return re.findall(r"```sql\n(.*?)```", text, re.S)


def test_the_duckdb_queries_of_the_guide_run_on_1024_ranks(tmp_path, monkeypatch):
    duckdb = pytest.importorskip("duckdb")
    job = _job_1024()
    write_tables(trace_tables(job), tmp_path)
    monkeypatch.chdir(tmp_path)  # the guide's queries name the files relative to the folder
    slowest, skew, ops = (duckdb.sql(q).df() for q in _doc_queries())
    steps = pd.DataFrame(
        [{"rank": r["rank"], **s} for r in job["ranks"] for s in r["per_step"]]
    )  # the same answers from the JSON, with pandas
    want = steps.loc[steps.groupby("step")["step_time_us"].idxmax()]
    assert slowest["slowest_rank"].tolist() == want["rank"].tolist() == [12, 12]
    assert slowest["step_time_us"].tolist() == want["step_time_us"].tolist()
    worst = max(job["stragglers"], key=lambda s: s["start_skew_us_max"])
    assert skew["start_skew_us"].iloc[0] == pytest.approx(worst["start_skew_us_max"])
    assert skew["ranks"].iloc[0] == 1024
    per_op = pd.DataFrame([o for r in job["ranks"] for o in r["ops"]])
    total = per_op.groupby("name")["total_us_per_step"].sum().sort_values(ascending=False)
    assert ops["name"].tolist()[:5] == total.index.tolist()[:5]
    # summed in another order (DuckDB adds in parallel): equal to float rounding
    assert ops["total_us_per_step"].tolist()[:5] == pytest.approx(total.tolist()[:5], rel=1e-12)


@pytest.mark.integration
def test_every_report_folder_holds_the_parquet_tables(ddp_mlp_run, tmp_path):
    out = tmp_path / "report"
    analysis.build_report(ddp_mlp_run, out=out)
    (run,) = json.loads((out / "summary.json").read_text(encoding="utf-8"))["runs"]
    ranks = run["trace"]["ranks"]
    steps = analysis.load_steps(out)
    want = [(r["rank"], s["step"], s["step_time_us"]) for r in ranks for s in r["per_step"]]
    assert list(zip(steps["rank"], steps["step"], steps["step_time_us"], strict=True)) == want
    assert set(steps["run_id"]) == {run["run_id"]}
    calls = analysis.load_collectives(out)
    for row in run["trace"]["collectives_per_rank"]:
        mine = calls[(calls["rank"] == row["rank"]) & (calls["name"] == row["name"])]
        assert len(mine) == row["calls"]
        assert mine["latency_us"].sum() == pytest.approx(row["latency_us_total"], rel=1e-12)
    assert len(analysis.load_ops(out)) == sum(len(r["ops"]) for r in ranks)
    memory = analysis.load_memory(out)
    want = [
        (r["rank"], d["device"], t, b)
        for r in ranks
        for d in r["memory"]["devices"]
        for t, b in zip(d["timeline"]["t_us"], d["timeline"]["allocated_bytes"], strict=True)
    ]
    cols = (memory["rank"], memory["device"], memory["t_us"], memory["allocated_bytes"])
    assert list(zip(*cols, strict=True)) == want and want  # the CPU run records its memory
