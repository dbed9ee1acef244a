"""Flight-recorder dumps read without trusting them and turned into a hang or desync diagnosis
(profiler/runfolder/flightrec.py, frdiag.py; workloads/launch/frexplain.py). The dumps come
from torch's own recorder in this process (a one-rank gloo group), edited per case."""

from __future__ import annotations

import copy
import json
import os
import pickle
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from profiler.runfolder.flightrec import DUMP_KIND, decode_dump, dump_name, read_dumps
from profiler.runfolder.frdiag import diagnose_dumps
from workloads.launch.frexplain import explain_failure
from workloads.launch.heartbeat import Heartbeat


@pytest.fixture(scope="module")
def torch_dumps() -> tuple[bytes, dict]:
    """torch's pickle and JSON dumps of 5 all_reduces of 1000 floats (a one-rank gloo group).
    The recorder is process-wide: entries of groups earlier tests made in this process (a
    1-rank DDP, say) are left out of both, so the dumps hold this group's calls alone."""
    start_ns = time.time_ns()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for _ in range(5):
            dist.all_reduce(torch.ones(1000))
        # Without stack traces: symbolising them takes seconds (the entries are the same).
        pickled = c10d._dump_fr_trace(includeStackTraces=False)
        as_json = json.loads(c10d._dump_fr_trace_json())
    finally:
        dist.destroy_process_group()

    def own(doc: dict) -> dict:
        doc["entries"] = [e for e in doc["entries"] if e["time_created_ns"] >= start_ns]
        return doc

    # torch's own dump, made just above: trusted here (dpscope's reader never unpickles code)
    return pickle.dumps(own(pickle.loads(pickled))), own(as_json)  # noqa: S301


def test_torchs_pickle_and_json_dumps_decode_to_the_same_entries(torch_dumps):
    pickled, as_json = torch_dumps
    raw = decode_dump(pickled)
    assert [e["collective_seq_id"] for e in raw["entries"]][-5:] == [1, 2, 3, 4, 5][-5:]
    assert raw["entries"][-1]["input_sizes"] == as_json["entries"][-1]["input_sizes"] == [[1000]]


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_pickle_holding_code_or_cut_short_is_one_line_and_runs_nothing(
    tmp_path, monkeypatch, torch_dumps
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"holds a (posix|os|nt)\.system object, not plain data"):
        decode_dump(pickle.dumps({"entries": [_Boom()]}))
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(ValueError, match="truncated or not a plain-data pickle"):
        decode_dump(torch_dumps[0][:200])
    with pytest.raises(ValueError, match="not valid JSON"):
        decode_dump(b'{"entries": [')


def _write(logs: Path, rank: int, trace: dict, *, run_id: str = "job", at: float | None = None):
    doc = {
        "kind": DUMP_KIND,
        "run_id": run_id,
        "rank": rank,
        "reason": "test",
        "dumped_at": time.time() if at is None else at,
        "trace": trace,
    }
    (logs / dump_name(rank)).write_text(json.dumps(doc))


def _entries(trace: dict, upto: int, sizes: dict[int, list] | None = None) -> dict:
    """`trace` keeping entries 1..upto of the default group, sizes replaced per seq."""
    out = copy.deepcopy(trace)
    out["entries"] = [e for e in out["entries"] if e["collective_seq_id"] <= upto]
    for e in out["entries"]:
        if sizes and e["collective_seq_id"] in sizes:
            e["input_sizes"] = e["output_sizes"] = sizes[e["collective_seq_id"]]
        if e["collective_seq_id"] == upto:
            e["retired"] = False  # still inside it when the rank dumped
    return out


def test_a_rank_that_never_entered_is_named_with_the_others_wait(tmp_path, torch_dumps):
    trace = torch_dumps[1]
    logs = tmp_path / "logs"
    logs.mkdir()
    for r in (0, 2, 3):
        _write(logs, r, _entries(trace, 5))
    _write(logs, 1, _entries(trace, 4))
    dumps, problems = read_dumps(logs, run_id="job")
    fr = diagnose_dumps(dumps, world_size=4, problems=problems)
    assert (fr["seq"], fr["collective"], fr["entered"], fr["never_entered"]) == (
        5,
        "all_reduce",
        [0, 2, 3],
        [1],
    )
    assert fr["message"].startswith("rank 1 never entered all_reduce #5 (ranks 0, 2, 3 waited ")
    assert fr["desync"] is None and fr["no_dump"] == [] and fr["problems"] == []


def test_ranks_that_used_different_sizes_are_a_desync(tmp_path, torch_dumps):
    logs = tmp_path / "logs"
    logs.mkdir()
    _write(logs, 0, _entries(torch_dumps[1], 5))
    _write(logs, 1, _entries(torch_dumps[1], 5, sizes={4: [[500]]}))
    fr = diagnose_dumps(*read_dumps(logs, run_id="job")[:1], world_size=2, problems=[])
    assert fr["seq"] == 4 and fr["never_entered"] == []
    assert [(d["rank"], d["input_sizes"]) for d in fr["desync"]] == [(0, [[1000]]), (1, [[500]])]
    assert fr["message"] == (
        "the ranks disagree at collective #4: rank 0 all_reduce [[1000]] Float, "
        "rank 1 all_reduce [[500]] Float"
    )


def test_dumps_of_another_job_and_missing_ranks_are_one_line_each(tmp_path, torch_dumps):
    logs = tmp_path / "logs"
    logs.mkdir()
    _write(logs, 0, _entries(torch_dumps[1], 5))
    _write(logs, 1, _entries(torch_dumps[1], 5), run_id="yesterday")
    _write(logs, 7, _entries(torch_dumps[1], 5))  # outside a world of 4
    (logs / dump_name(3)).write_text(
        json.dumps({"kind": DUMP_KIND, "run_id": "job", "rank": 2, "trace": {"entries": []}})
    )
    old = logs / "nccl_trace_rank_2"
    old.write_bytes(torch_dumps[0])
    os.utime(old, (1e9, 1e9))  # written long before this run started
    (logs / "nccl_trace_rank_3").write_bytes(torch_dumps[0][:300])
    dumps, problems = read_dumps(logs, run_id="job", since=time.time() - 60)
    fr = diagnose_dumps(dumps, world_size=4, problems=problems)
    assert sorted(dumps) == [0, 7]  # rank 7 is dropped by the diagnosis, with its line
    lines = "\n".join(fr["problems"])
    assert "logs/rank1.flightrec.json: from another job (run_id 'yesterday') — ignored" in lines
    assert "logs/rank3.flightrec.json: says rank 2 but is named rank 3 — ignored" in lines
    assert "logs/nccl_trace_rank_2: older than this run, so from another job — ignored" in lines
    assert "logs/nccl_trace_rank_3: truncated or not a plain-data pickle" in lines
    assert "logs/rank7.flightrec.json: rank 7 is outside the world of 4 ranks" in lines
    assert "no dump from ranks 1, 2, 3" in lines
    assert all("\n" not in p for p in fr["problems"])
    assert fr["message"].startswith("rank 0 last entered all_reduce #5 with input sizes [[1000]]")


def _run(tmp_path: Path) -> tuple[Path, dict]:
    run_dir = tmp_path / "job"
    (run_dir / "logs").mkdir(parents=True)
    record = {
        "run_id": "job",
        "created_at": "2000-01-01T00:00:00+00:00",
        "config": {"world_size": 2},
    }
    return run_dir, record


def test_a_hang_error_names_the_stuck_rank_its_collective_and_its_last_phase(tmp_path, torch_dumps):
    run_dir, record = _run(tmp_path)
    logs = run_dir / "logs"
    _write(logs, 0, _entries(torch_dumps[1], 5))
    _write(logs, 1, _entries(torch_dumps[1], 4))
    beat = Heartbeat.of_rank(run_dir, 1, attempt=0, collectives=True)
    beat.beat(12, "data")
    beat._write()
    error = {"kind": "hang", "message": "rank 0 failed: RuntimeError: timed out", "rank": 0}
    out = explain_failure(run_dir, error, record, tail=lambda p: [p.name])
    assert (
        out["kind"] == "hang" and out["rank"] == 1 and (out["step"], out["phase"]) == (12, "data")
    )
    assert out["message"].startswith("rank 1 never entered all_reduce #5 (rank 0 waited ")
    assert (
        "; its last phase: data, step 12 — rank 0 failed: RuntimeError: timed out" in out["message"]
    )
    assert out["log_tail"] == ["rank1.log"] and out["flight_recorder"]["seq"] == 5
    # A script's record says `crash` for any exception: a timeout's message makes it the hang...
    timeout = {
        **error,
        "kind": "crash",
        "message": "rank 0 failed: RuntimeError: Timed out waiting",
    }
    assert explain_failure(run_dir, timeout, record, tail=lambda p: [])["kind"] == "hang"
    # ...while a rank that raised is the cause: the others waiting for it are a consequence.
    crash = {"kind": "crash", "message": "rank 1 failed: RuntimeError: out of patience", "rank": 1}
    out = explain_failure(run_dir, crash, record, tail=lambda p: [])
    assert out["kind"] == "crash" and out["rank"] == 1
    assert out["message"].startswith(
        "rank 1 failed: RuntimeError: out of patience; flight recorder: rank 1 never entered "
        "all_reduce #5 (rank 0 waited "
    )


def test_gloos_abort_line_makes_a_desync_and_a_killed_rank_stays_killed(tmp_path, torch_dumps):
    run_dir, record = _run(tmp_path)
    logs = run_dir / "logs"
    _write(logs, 0, _entries(torch_dumps[1], 5))
    killed = {
        "kind": "killed",
        "message": "rank 1 was killed by SIGKILL",
        "rank": 1,
        "exit_code": -9,
    }
    out = explain_failure(run_dir, killed, record, tail=lambda p: [])
    assert out["kind"] == "killed"
    assert out["message"].startswith(
        "rank 1 was killed by SIGKILL; flight recorder: rank 0 last entered all_reduce #5 "
        "with input sizes [[1000]] (Float); rank 0 waited "
    )
    (logs / "launcher.log").write_text(
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce "
        "fail at pair.cc:464] op.preamble.length <= op.nbytes. 1000 vs 500. Received data size "
        "doesn't match expected size. Is there a distributed collective mismatch in your code?\n"
    )
    out = explain_failure(run_dir, {**killed, "exit_code": -6}, record, tail=lambda p: [])
    assert out["kind"] == "desync"
    assert out["message"].startswith("desync at all_reduce #5: gloo aborted rank 1 (")
    assert "rank 0 last entered all_reduce #5 with input sizes [[1000]]" in out["message"]
    # What each rank used: rank 0 from its dump, the aborted rank 1 from gloo's line alone.
    assert out["flight_recorder"]["desync"] == [
        {
            "rank": 0,
            "op": "all_reduce",
            "input_sizes": [[1000]],
            "output_sizes": [[1000]],
            "dtypes": ["Float"],
        },
        {"rank": 1, "op": None, "received_bytes": 1000, "expected_bytes": 500},
    ]
    single = {**record, "config": {"world_size": 1}}
    assert explain_failure(run_dir, killed, single, tail=lambda p: []) == killed
