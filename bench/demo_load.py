"""`make bench-demo-load`: `make demo` on a busy machine, as a new user on a shared node runs it,
with this tree and (`--before DIR`, a checkout of an older dpscope) the one it replaces.

Both demos run one after the other beside one bursty CPU hog (bench/cpuhog.py: `--hog-workers`
processes, each busy `--hog-duty` of every `--hog-period-s`, so the 1-minute load is about the
demo's own plus workers × duty: 4 on 2 cores by default). Per demo the JSON keeps:
- `wall_s`, `load_avg_1m_start` / `_end`;
- for the single-device group and the DDP group on 2 or more ranks: the throughput's
  `samples_per_s_min` / `_max` / `spread_pct` over the group's runs, `speedup_mean`,
  `efficiency_pct_mean`, and where the tree has them `speedup_median` with its 95% CI,
  `n_rounds` and `throughput_basis`;
- `split_largest_pts` / `split_loss_pts`: the largest part of "where the efficiency went" and the
  loss it splits (a part larger than the loss is the split's noise);
- `quiet_steps` / `busy_steps` summed over the runs (this tree only);
- `verdict`: the report's verdict paragraph, as text.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from bench.common import bench_out, write_json
from bench.cpuhog import running_hog
from workloads.launch.child import PACKAGE_ROOT, child_env, user_path

__all__ = ["main"]


class _Verdict(HTMLParser):
    """The text inside the element with id="verdict"."""

    def __init__(self) -> None:
        super().__init__()
        self.depth, self.parts = 0, []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if self.depth or dict(attrs).get("id") == "verdict":
            self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        self.depth = max(self.depth - 1, 0)

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.parts.append(data)


def _verdict_text(html: str) -> str:
    parser = _Verdict()
    parser.feed(html)
    return re.sub(r"\s+", " ", "".join(parser.parts)).strip()[:2000]


def _group(summary: dict, mode: str, ranks: int) -> dict | None:
    for g in summary.get("groups", []):
        if g.get("mode") == mode and (g.get("world_size") or 0) >= ranks:
            return g
    return None


def _figures(g: dict | None) -> dict[str, Any]:
    if g is None:
        return {}
    out = {k: g.get(k) for k in ("samples_per_s_min", "samples_per_s_max", "speedup_mean",
                                 "speedup_median", "speedup_ci95_low", "speedup_ci95_high",
                                 "n_rounds", "throughput_basis")}  # fmt: skip
    out["spread_pct"] = g.get("samples_per_s_spread_pct")
    eff = g.get("scaling_efficiency_mean")
    out["efficiency_pct_mean"] = None if eff is None else 100 * eff
    parts = {k: v for k, v in (g.get("efficiency_loss_pts") or {}).items() if v is not None}
    if parts and eff is not None:
        out["split_largest_pts"] = max(abs(v) for v in parts.values())
        out["split_loss_pts"] = 100 * (1 - eff)
    return out


def _demo(tree: Path, work: Path, extra: list[str]) -> dict[str, Any]:
    """One `dpscope demo` of the dpscope in `tree`, its runs and report under `work`."""
    env = child_env() if tree == PACKAGE_ROOT else dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "workloads.tools.demo", "--runs-dir", str(work / "runs"),
           "--out", str(work / "report"), *extra]  # fmt: skip
    load0, start = os.getloadavg()[0], time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=7200)
    out: dict[str, Any] = {"wall_s": time.perf_counter() - start, "load_avg_1m_start": load0,
                           "load_avg_1m_end": os.getloadavg()[0], "exit_code": proc.returncode}  # fmt: skip
    if proc.returncode != 0:
        out["error"] = (proc.stderr or proc.stdout)[-1000:]
        return out
    summary = json.loads((work / "report" / "summary.json").read_text(encoding="utf-8"))
    out["single"] = _figures(_group(summary, "single", 1))
    out["ddp"] = _figures(_group(summary, "ddp", 2))
    runs = [r for r in summary.get("runs", []) if r.get("status") == "ok"]
    for key in ("quiet_steps", "busy_steps"):
        if any(key in r for r in runs):
            out[key] = sum(r.get(key) or 0 for r in runs)
    loads = [(r.get("host_load") or {}).get("other_cpu_cores_mean") for r in runs]
    loads = [v for v in loads if v is not None]
    out["other_cpu_cores_mean"] = sum(loads) / len(loads) if loads else None
    html = (work / "report" / "index.html").read_text(encoding="utf-8")
    out["verdict"] = _verdict_text(html)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.demo_load", description=__doc__.split("\n")[0])  # fmt: skip
    parser.add_argument(
        "--before", type=Path, default=None, help="a checkout of the dpscope to compare with"
    )
    parser.add_argument("--hog-workers", type=int, default=4, help="hog processes (default 4)")
    parser.add_argument(
        "--hog-duty", type=float, default=0.5, help="share of each period a hog process is busy"
    )
    parser.add_argument("--hog-period-s", type=float, default=2.0, help="seconds per on/off cycle")
    parser.add_argument(
        "--json", default=None, help="output (default reports/bench/demo_load.json)"
    )
    args, extra = parser.parse_known_args(argv)  # the rest goes to both demos
    trees = {"after": PACKAGE_ROOT}
    if args.before is not None:
        trees = {"before": user_path(args.before), **trees}
    result: dict[str, Any] = {"hog": {"workers": args.hog_workers, "duty": args.hog_duty,
                                      "period_s": args.hog_period_s}, "demo_args": " ".join(extra)}  # fmt: skip
    path, here = bench_out("demo_load", args.json), Path.cwd()
    with tempfile.TemporaryDirectory(prefix="dpscope-demo-load-") as tmp:
        # Both demos run from a scratch folder, as a user runs `dpscope demo` from theirs: a
        # child's `python -m` puts its folder first on sys.path, so run from a dpscope clone the
        # older demo's children would import this one.
        os.chdir(tmp)
        try:
            with running_hog(args.hog_workers, args.hog_duty, args.hog_period_s, deadline_s=7200):
                for name, tree in trees.items():
                    print(f"demo ({name}): {tree} ...", flush=True)
                    result[name] = _demo(tree, Path(tmp) / name, extra)
                    print(json.dumps(result[name], indent=2), flush=True)
        finally:
            os.chdir(here)
    write_json(path, result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
