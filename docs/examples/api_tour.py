# %% [markdown]
# # dpscope from Python
#
# A notebook in percent format (open it in Jupyter or VS Code, or run it as a script:
# `python docs/examples/api_tour.py RUNS`). RUNS is a folder of run folders with a single and
# a DDP run, e.g. after `make demo`. The suite runs this file (tests/test_api.py). Nothing here
# needs torch: the analysis runs on any machine that has the run folders.

# %%
import sys
from pathlib import Path

import analysis as dp

RUNS = Path(sys.argv[1] if len(sys.argv) > 1 else "runs")
OUT = Path(sys.argv[2] if len(sys.argv) > 2 else "reports")

# %% [markdown]
# ## One row per run
# The report's run table as a DataFrame; every column name carries its unit.

# %%
runs = dp.load_runs(RUNS)
ok = runs[runs["status"] == "ok"]
print(ok[["run_id", "mode", "world_size", "samples_per_s", "speedup_ratio"]].to_string(index=False))

# %% [markdown]
# ## Scaling of the DDP runs
# Speedup is throughput over the single-device run of the same workload; efficiency is speedup
# over the world size (1.0 = linear).

# %%
ddp = ok[ok["mode"] == "ddp"]
for row in ddp.itertuples():
    print(
        f"{row.run_id}: {row.speedup_ratio:.2f}x on {row.world_size} ranks, "
        f"efficiency {row.scaling_efficiency_ratio:.0%}"
    )

# %% [markdown]
# ## Collectives and one run's traces

# %%
comm = dp.collectives(RUNS)
print(comm[["run_id", "name", "calls", "bytes_total", "busbw_gbps"]].to_string(index=False))
first = ddp.iloc[0]["run_id"]
traces = dp.analyze_traces(RUNS / first / "traces")
for rank in traces["ranks"]:
    print(f"{first} rank {rank['rank']}: overlap {rank['overlap_pct']:.1f}% of comm")

# %% [markdown]
# ## The report

# %%
index = dp.build_report(RUNS, out=OUT)
print(f"report: {index}")
