"""dpscope analysis: Kineto traces and run folders in, metrics out. Never imports torch.

- `analysis.trace.folder.analyze_trace_dir`: per-rank compute/comm/overlap, per-collective bandwidth,
  stragglers, for any folder of per-rank traces (`python -m analysis traces DIR`).
- `analysis.runs.compare.compare_runs`: speedup, efficiency, phases, memory imbalance and accuracy across
  run folders (`python -m analysis runs RUNS_DIR`).
- `analysis.runs.opdiff.run_ops` / `diff_runs`: top operators per rank by self time, and what changed
  between two runs (`python -m analysis ops RUN`, `python -m analysis diff RUN_A RUN_B`).

Definitions of every number: docs/analysis.md.
"""

from analysis.errors import AnalysisError

__all__ = ["AnalysisError"]
