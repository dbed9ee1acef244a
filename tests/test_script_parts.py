"""The `--script` launcher's decisions from its ranks' parts, in-process: how a run ended (status,
error, exit code), the traces it lists or leaves out, and the profiler's lines kept out of the
terminal (workloads.launch.scriptend, profiler.runfolder.parts, workloads.launch.kinetolog)."""

from __future__ import annotations

import io
import os
import signal
from pathlib import Path

import msgspec
import pytest
from msgspec.structs import replace

from profiler.runfolder.parts import assemble, read_parts, write_part
from profiler.runfolder.schema import RankPart, RunRecord
from tests.test_baselines import PROFILE, rank_part
from workloads.launch.kinetolog import ProfilerLogFilter, is_profiler_line
from workloads.launch.scriptend import exit_code, signal_of
from workloads.launch.supervise import Outcome


def _stopped(part: RankPart, name: str, at: float) -> RankPart:
    code = 128 + int(signal.Signals[name])
    return replace(part, ended="signal", signal=name, signal_time=at, exit_code=code)


def test_a_signal_to_a_rank_interrupts_unless_a_rank_failed_by_itself():
    a, b = rank_part(0, 2, [1.0] * 3), rank_part(1, 2, [1.0] * 3)
    # SIGTERM reached rank 1 first; rank 0 got torchrun's later one: interrupted by rank 1's.
    name, first = signal_of(
        Outcome(1), [_stopped(a, "SIGTERM", 2.0), _stopped(b, "SIGTERM", 1.0)], 2
    )
    assert (name, first.rank) == ("SIGTERM", 1)
    # Rank 1 raised and torchrun stopped rank 0 with SIGTERM: a failure, not an interruption.
    failed = replace(b, ended="failed", exit_code=1)
    assert signal_of(Outcome(1), [_stopped(a, "SIGTERM", 1.0), failed], 2) == (None, None)
    # A rank without a part (SIGKILL) fails the run too; the launcher's own signal always wins.
    assert signal_of(Outcome(1), [_stopped(a, "SIGTERM", 1.0)], 2) == (None, None)
    assert signal_of(Outcome(-2, interrupted="SIGINT"), [failed], 2)[0] == "SIGINT"


@pytest.mark.parametrize(
    ("record", "code"),
    [
        ({"status": "ok"}, 0),
        ({"status": "failed", "error": {"exit_code": 3}}, 3),
        ({"status": "failed", "error": {"exit_code": -9}}, 137),  # killed by SIGKILL
        ({"status": "failed", "error": {"exit_code": None}}, 1),
        ({"status": "interrupted", "error": {"exit_code": 130}}, 130),
    ],
)
def test_dpscope_exits_with_the_scripts_code(record, code):
    rec = msgspec.convert(
        {"schema_version": 2, "config": {"mode": "single", "world_size": 1}, **record}, RunRecord
    )
    assert exit_code(rec) == code


def _folder(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "traces").mkdir()
    return run_dir


def _assemble(run_dir: Path, parts: list[RankPart], status: str = "ok") -> RunRecord:
    return assemble(run_dir, parts, run_id="run", status=status, profile=PROFILE, warmup_steps=2)


def test_processes_that_never_joined_a_group_leave_their_traces_out_with_the_reason(tmp_path):
    run_dir = _folder(tmp_path)
    parts = []
    for rank in (0, 1):
        name = f"traces/rank{rank}.1.pt.trace.json.gz"
        (run_dir / name).write_bytes(b"")
        parts.append(replace(rank_part(rank, 1, [1.0] * 3), env_world_size=2, traces=[name]))
    rec = _assemble(run_dir, parts)
    assert rec.traces == ["traces/rank0.1.pt.trace.json.gz"]
    (left,) = rec.traces_left_out
    assert left.file == "traces/rank1.1.pt.trace.json.gz"
    assert "rank 1 never joined a process group" in left.reason
    assert (rec.config.mode, rec.config.world_size) == ("single", 1)


def test_a_script_that_failed_before_any_group_is_the_ddp_run_it_was_launched_as(tmp_path):
    run_dir = _folder(tmp_path)
    parts = [
        replace(rank_part(r, 1, []), env_world_size=2, ended="failed", exit_code=1) for r in (0, 1)
    ]
    rec = _assemble(run_dir, parts, status="running")
    assert (rec.config.mode, rec.config.world_size) == ("ddp", 2)
    assert any(
        w.startswith("the script failed before init_process_group: rank 0") for w in rec.warnings
    )
    assert not any("trained alone" in w for w in rec.warnings)


@pytest.mark.parametrize(
    ("hosts", "nnodes", "per_node"),
    [
        (("a", "a"), 1, 2),
        (("a", "b"), 2, 1),
        (("a", "b", "b"), 2, 2),
        (("a", None), None, 2),  # a part without its host: unknown, never "one node"
        (("a",), None, 1),  # rank 1 of 2 left no part (its node died): unknown
    ],
)
def test_config_counts_the_hosts_only_when_every_rank_named_its_own(
    tmp_path, hosts, nnodes, per_node
):
    # The one-node host rule (analysis.runs.fields.one_node_host) trusts `nnodes`: a
    # RunRecorder job on two hosts must not say one node.
    world = max(2, len(hosts))
    parts = [
        replace(rank_part(r, world, [1.0] * 3), env=replace(rank_part(r, 2, []).env, hostname=h))
        for r, h in enumerate(hosts)
    ]
    rec = _assemble(_folder(tmp_path), parts)
    assert (rec.config.nnodes, rec.config.nproc_per_node) == (nnodes, per_node)
    assert rec.env.hostname == hosts[0]


def test_a_killed_ranks_traces_on_disk_are_listed(tmp_path):
    """Rank 1 was SIGKILLed after exporting its trace: no part, but its trace is the run's."""
    run_dir = _folder(tmp_path)
    for name in ("rank0.1.pt.trace.json.gz", "rank1.2.pt.trace.json.gz"):
        (run_dir / "traces" / name).write_bytes(b"")
    part = replace(rank_part(0, 2, [1.0] * 3), traces=["traces/rank0.1.pt.trace.json.gz"])
    write_part(run_dir, part)
    assert read_parts(run_dir) == [part]  # a part file reads back as it was written
    rec = _assemble(run_dir, [part], status="running")
    assert rec.traces == ["traces/rank0.1.pt.trace.json.gz", "traces/rank1.2.pt.trace.json.gz"]
    assert any(w.startswith("rank 1 wrote no part") for w in rec.warnings)


@pytest.mark.parametrize(
    ("line", "profilers"),
    [
        (b"USDT:2026-12-01 19:23:18 8734:8734 SyncActivityProfilerHandler.cpp:39] profiler_start", True),
        (b"ERROR:2026-12-01 19:24:09 9538:9538 DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35", True),
        (b"[rank1]:[W1201 19:33:30.846855013 CPUAllocator.cpp:245] Memory block of unknown size was allocated before the profiling started", True),
        (b"ERROR: my training diverged", False),
        (b"Epoch: [0][10] Time 0.1", False),
        (b"[W1201 19:33:30.846 Module.cpp:12] the script's own torch warning", False),
    ],
)  # fmt: skip
def test_only_the_profilers_own_lines_are_moved(line, profilers):
    assert is_profiler_line(line) is profilers


@pytest.mark.skipif(os.name != "posix", reason="the filter is POSIX only")
def test_the_filter_passes_everything_else_unchanged_and_holds_only_what_may_be_profilers(tmp_path):
    read, write = os.pipe()
    filt = ProfilerLogFilter(tmp_path / "p.log")
    filt._saved = write
    log = io.BytesIO()
    usdt = b"USDT:2026-12-01 19:23:18 1:1 SyncActivityProfilerHandler.cpp:39] profiler_start\n"
    rest = filt._split(b"loss 1.0\n" + usdt + b"\r 10%|#  |" + b"", log)
    assert rest == b"" and log.getvalue() == usdt
    assert filt._split(b"USD", log) == b"USD"  # may still become a profiler line: held
    os.close(write)
    with os.fdopen(read, "rb") as r:
        assert r.read() == b"loss 1.0\n\r 10%|#  |"
