"""The orphan-kernel edit of a real trace (tests/data/hta_orphans/README.md): remove the runtime
launch events of the first N GPU events of one rank, so those kernels become orphans (their
correlation id matches no runtime launch), as when GPU work was queued before the profiler went
active. Used by the test that compares dpscope with HTA 0.5.0 on the edited pair, and by
`make hta-orphans-reference`, which re-runs HTA on it (bench-only: needs HTA).

The single-step variant (`single_step=True`) also drops each rank's last ProfilerStep event
(#552), leaving one step name across the pair: HTA then applies no kernel filter at all (every
kernel kept, the orphans included), which is the case its reference `SINGLE_REFERENCE` pins."""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
from importlib.metadata import version
from pathlib import Path

from bench.common import TEST_DATA

__all__ = [
    "EDITS",
    "REFERENCE",
    "SINGLE_REFERENCE",
    "SOURCE",
    "edit_trace",
    "main",
    "write_edited_pair",
]

# rank file (under tests/data/hta/trace_filter) -> N: different counts per rank, both taking in
# NCCL kernels (the 56th GPU event of rank 0 and the 68th and 199th of rank 1 are SendRecv).
EDITS = {"sampled_rank-0.json.gz": 60, "sampled_rank-1.json.gz": 200}
SOURCE = TEST_DATA / "hta" / "trace_filter"
REFERENCE = TEST_DATA / "hta_orphans" / "hta_0.5.0.json"
SINGLE_REFERENCE = TEST_DATA / "hta_orphans" / "hta_0.5.0_single_step.json"
LAST_STEP = "ProfilerStep#552"  # the pair's second (last) step
_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}


def edit_trace(trace: dict, n: int, *, single_step: bool = False) -> dict:
    """`trace` without the runtime events that launched its first `n` GPU events (by start,
    then correlation id), and with `single_step` without its last ProfilerStep event; every
    other event is kept as it is."""
    events = trace["traceEvents"]
    gpu = sorted(
        (e for e in events if e.get("cat") in _GPU_CATS),
        key=lambda e: (e["ts"], e["args"]["correlation"]),
    )
    gone = {e["args"]["correlation"] for e in gpu[:n]}
    kept = [
        e
        for e in events
        if not (e.get("cat") in _RUNTIME_CATS and e.get("args", {}).get("correlation") in gone)
        and not (single_step and e.get("name") == LAST_STEP)
    ]
    return {**trace, "traceEvents": kept}


def write_edited_pair(src: Path, out: Path, *, single_step: bool = False) -> list[Path]:
    """The edited copies of `src`'s rank files (EDITS) written into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, n in EDITS.items():
        trace = json.loads(gzip.decompress((src / name).read_bytes()))
        edited = edit_trace(trace, n, single_step=single_step)
        path = out / name
        path.write_bytes(gzip.compress(json.dumps(edited).encode(), mtime=0))
        paths.append(path)
    return paths


def _hta_figures(trace_dir: Path) -> dict:
    """HTA's temporal breakdown and comm/comp overlap per rank, as HTA returns them."""
    import logging

    from hta.trace_analysis import TraceAnalysis  # bench-only (requirements-bench.txt)

    logging.disable(logging.WARNING)
    analysis = TraceAnalysis(trace_dir=str(trace_dir))
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    return {
        "temporal_breakdown": json.loads(breakdown.to_json(orient="records")),
        "comm_comp_overlap": json.loads(overlap.to_json(orient="records")),
    }


def main(argv: list[str] | None = None) -> None:
    """Re-run HTA on the edited pair and write its figures to the reference file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REFERENCE, help="reference JSON to write")
    parser.add_argument(
        "--single-out",
        type=Path,
        default=SINGLE_REFERENCE,
        help="reference JSON of the single-step variant",
    )
    args = parser.parse_args(argv)
    for single, out in ((False, args.out), (True, args.single_out)):
        with tempfile.TemporaryDirectory() as tmp:
            write_edited_pair(SOURCE, Path(tmp), single_step=single)
            figures = _hta_figures(Path(tmp))
        record = {
            "produced_by": "python -m bench.orphan_edit (make hta-orphans-reference)",
            "hta_version": version("HolisticTraceAnalysis"),
            "pandas_version": version("pandas"),
            "source": "tests/data/hta/trace_filter",
            "edits": EDITS,
            **({"dropped_step": LAST_STEP} if single else {}),
            **figures,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
