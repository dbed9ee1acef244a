"""Issue 30, a user's own FSDP2 script (tests/scripts/fsdp2_example.py, the shape of PyTorch's
FSDP2 example: fully_shard on each layer, then the model, Adam), copied outside the repository
and profiled unedited under `--script --mode fsdp` on 2 real gloo ranks: the mode is recorded as
seen, and its memory and collectives are analysed as a built-in FSDP2 run's are, against a hand
computation."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.trace.folder import analyze_trace_dir
from tests.conftest import read_run
from tests.script_common import ok, profile, user_folder

pytestmark = pytest.mark.integration

# The script's parameters (vocabulary 11, width 8, 2 layers), fp32 bytes per rank of 2: dim 0
# in 2 chunks (torch.chunk: ceil, then the rest), every shard padded to the first chunk's size.
# (rows on rank 0, rows on rank 1, bytes per row) of each parameter, in model order:
PARAMS = [(6, 5, 32), *[(4, 4, 4), (4, 4, 4), (4, 4, 32), (4, 4, 4)] * 2, (6, 5, 32), (6, 5, 4)]
PADDED = sum(r0 * row for r0, _, row in PARAMS)  # 760 B on both ranks
REAL = [PADDED, sum(r1 * row for _, r1, row in PARAMS)]  # 760 B, 692 B
ROOT = 2 * (6 * 32 + 6 * 32 + 6 * 4)  # embedding and head: the root's all-gather output
LAYER = 2 * (4 * 4 + 4 * 4 + 4 * 32 + 4 * 4)  # one layer's


@pytest.fixture(scope="module")
def script_run(tmp_path_factory) -> Path:
    user = user_folder(tmp_path_factory.mktemp("fsdp user"))
    ok(profile(user, "--script", "fsdp2_example.py", "--mode", "fsdp", "--run-id", "fsdp-script",
               "--", "--steps", "6", "--batch", "4"))  # fmt: skip
    return user / "runs" / "fsdp-script"


def test_the_script_is_recorded_as_the_fsdp2_it_is(script_run: Path) -> None:
    rec = read_run(script_run)
    assert rec["status"] == "ok", rec["error"]
    cfg = rec["config"]
    assert (cfg["mode"], cfg["world_size"], cfg["zero"]) == ("fsdp", 2, 0)
    assert cfg["fsdp"] == {"wrap": "seen", "reshard_after_forward": True}
    assert cfg["model"] == "Net"  # the user's class, not FSDP2's FSDPNet
    groups = rec["metrics"]["fsdp"]["groups"]
    assert [g["module"] for g in groups] == ["", "layers.0", "layers.1"]
    assert [g["unsharded_bytes"] for g in groups] == [ROOT, LAYER, LAYER]


def test_the_scripts_memory_is_counted_from_its_shards(script_run: Path) -> None:
    entries = {e["rank"]: e for e in read_run(script_run)["metrics"]["memory_breakdown"]}
    assert sorted(entries) == [0, 1]
    for rank, e in entries.items():
        assert e["parameters_bytes"] == e["gradients_bytes"] == PADDED
        assert e["ddp_buckets_bytes"] == 0
        # Adam: exp_avg and exp_avg_sq of the real chunk, and one fp32 `step` per parameter
        assert e["optimizer_state_bytes"] == 2 * REAL[rank] + 4 * len(PARAMS)
        # layer 1's backward: the root (kept from forward), layer 1 re-gathered and layer 0
        # prefetched
        assert e["fsdp_unsharded_peak_bytes"] == ROOT + 2 * LAYER


def test_the_scripts_all_gathers_and_reduce_scatters_are_named_and_sized(script_run) -> None:
    trace = analyze_trace_dir(script_run / "traces", progress=False)
    rows = {c["name"]: c for c in trace["collectives"]}
    steps = trace["ranks"][0]["steps"]
    ag, rs = rows["gloo:all_gather"], rows["gloo:reduce_scatter"]
    assert (ag["algorithm"], rs["algorithm"]) == ("gloo:all_gather", "gloo:all_reduce")
    by_phase = {p["phase"]: p for p in ag["phases"]}
    # forward: every group; backward: the layers again (the root keeps its parameters)
    assert by_phase["forward"]["bytes_total"] == (ROOT + 2 * LAYER) * steps
    assert by_phase["backward"]["bytes_total"] == 2 * LAYER * steps
    (back,) = rs["phases"]
    assert back["phase"] == "backward" and back["bytes_total"] == (ROOT + 2 * LAYER) * steps
    assert ag["busbw_gbps"] > 0 and rs["busbw_gbps"] > 0
