# dpscope: the user interface. Every target depends on `setup`, so a fresh clone works
# with nothing done first. Variables can be overridden: `make profile-ddp NPROC=4 MODEL=mlp`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.requirements.stamp
# The `dpscope` command of this clone (what `pip install -e .` installs as .venv/bin/dpscope).
DPSCOPE  := $(PY) -m workloads.tools.cli

# Paths (RUNS, REPORT_DIR) are quoted in the recipes, so a folder name may contain spaces.
# --- workload ---------------------------------------------------------------------------
# NPROC empty: the launcher's default, one DDP process per visible GPU (DP: every GPU), 2 on CPU.
NPROC    ?=
BACKEND  ?= auto
MODEL    ?= resnet18
DATASET  ?= synthetic
EPOCHS   ?= 1
# 16: 2 warm-up steps and the profiler window (steps 1-4) leave 11 unprofiled measured steps
# for throughput (at least 8 wanted; run.json warns when there are none).
STEPS    ?= 16
BATCH    ?= 64
SEEDS    ?= 0
# profile-all as interleaved rounds (single, DDP, single, DDP, ...): a count, or `auto` = until
# the speedup's 95% CI is within ±5% (3 to 5 rounds; REPEAT_BUDGET_S=S bounds it in seconds).
REPEAT   ?= 1
REPEAT_BUDGET_S ?=
RUNS     ?= runs
ARGS     ?=
# --- profiler schedule (torch.profiler.schedule) -------------------------------------------
PROF_WAIT   ?= 1
PROF_WARMUP ?= 1
PROF_ACTIVE ?= 3
PROF_REPEAT ?= 1
# --- report / tensorboard ----------------------------------------------------------------
REPORT_DIR ?= reports
PORT       ?= 6006

PROFILE_FLAGS = --profile-wait $(PROF_WAIT) --profile-warmup $(PROF_WARMUP) \
                --profile-active $(PROF_ACTIVE) --profile-repeat $(PROF_REPEAT)
NPROC_FLAG = $(if $(strip $(NPROC)),--nproc $(NPROC))
REPEAT_FLAGS = --repeat $(REPEAT) $(if $(strip $(REPEAT_BUDGET_S)),--repeat-budget-s $(REPEAT_BUDGET_S))
RUN_FLAGS = --model $(MODEL) --dataset $(DATASET) --epochs $(EPOCHS) --max-steps $(STEPS) \
            --batch-size $(BATCH) --runs-dir "$(RUNS)" $(PROFILE_FLAGS)

.PHONY: help setup profile-single profile-dp profile-ddp profile-fsdp profile-zero1 profile-all profile-script report demo tensorboard \
        bench-analysis hta-orphans-reference gpu-check test test-fast test-load golden docs lint format clean

help:
	@echo "dpscope targets: setup profile-single profile-dp profile-ddp profile-fsdp profile-zero1 profile-all"
	@echo "                 profile-script profile-sweep report demo tensorboard tune-ddp bench-comm bench-projection bench-family"
	@echo "                 bench bench-overhead bench-analysis bench-report bench-demo-load hta-orphans-reference gpu-check"
	@echo "                 test test-fast test-load golden docs lint format clean"
	@echo "every target and variable: docs/reference/make.md; the dpscope command: docs/reference/cli.md"

# Re-install only when requirements.txt or pyproject.toml changed (the stamp is newer otherwise):
# the pinned versions first, then dpscope itself, editable (the `dpscope` command). --no-compile,
# then compileall on every core: pip byte-compiles on one core (half the venv's build time on 2
# cores; docs/benchmarks.md, Test suite). The .pyc files must exist before anything runs: where
# PYTHONDONTWRITEBYTECODE is set, nothing writes them later, and every process would compile
# torch and pandas from source again (about 2 s of CPU each). dpscope's own modules too (the
# launched ranks, CLIs and test processes import them from this checkout; one edited later is
# compiled in memory). torch's py312_* test helpers are in newer syntax and never imported here;
# a file that fails is named and only slower to import, so setup goes on.
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install --no-compile -r requirements.txt
	$(PY) -m pip install -q --no-compile -e .
	$(PY) -m compileall -q -j 0 -x '/py3[0-9]+_[a-z_]+\.py$$' $(VENV)/lib \
	    analysis profiler workloads bench tests \
	    || echo "[setup] the files above did not byte-compile: Python compiles them on import"
	@touch $(STAMP)

setup: $(STAMP)

profile-single: setup
	@for s in $(SEEDS); do $(DPSCOPE) profile --mode single --seed $$s $(RUN_FLAGS) $(ARGS) || exit $$?; done

profile-dp: setup
	@for s in $(SEEDS); do $(DPSCOPE) profile --mode dp --seed $$s $(RUN_FLAGS) $(ARGS) || exit $$?; done

profile-ddp: setup
	@for s in $(SEEDS); do $(DPSCOPE) profile --mode ddp $(NPROC_FLAG) --backend $(BACKEND) --seed $$s $(RUN_FLAGS) $(ARGS) || exit $$?; done

# FSDP2 (fully_shard on each block, then the root): FSDP_WRAP=MODULE:CLASS[,...] names the blocks,
# RESHARD=false keeps the gathered blocks from forward to backward (ZeRO-2-like).
FSDP_WRAP ?=
RESHARD   ?= true
FSDP_FLAGS = $(if $(strip $(FSDP_WRAP)),--fsdp-wrap "$(FSDP_WRAP)") --fsdp-reshard-after-forward $(RESHARD)
profile-fsdp: setup
	@for s in $(SEEDS); do $(DPSCOPE) profile --mode fsdp $(NPROC_FLAG) --backend $(BACKEND) $(FSDP_FLAGS) --seed $$s $(RUN_FLAGS) $(ARGS) || exit $$?; done

# ZeRO-1: DDP with ZeroRedundancyOptimizer around the same optimizer.
profile-zero1: setup
	@for s in $(SEEDS); do $(DPSCOPE) profile --mode ddp --zero 1 $(NPROC_FLAG) --backend $(BACKEND) --seed $$s $(RUN_FLAGS) $(ARGS) || exit $$?; done

# --mode all (single, dp, ddp-nccl, ddp-gloo as the machine allows), then the sharded members
# MODES names (zero1, fsdp) on DDP's backend and ranks: `make profile-all MODES="single dp ddp fsdp"`.
FAMILY_zero1 = --mode ddp --zero 1
FAMILY_fsdp  = --mode fsdp
profile-all: setup
	@for s in $(SEEDS); do $(DPSCOPE) profile --mode all $(NPROC_FLAG) --seed $$s $(RUN_FLAGS) $(REPEAT_FLAGS) $(ARGS) || exit $$?; \
	    $(foreach m,$(filter zero1 fsdp,$(MODES)),$(DPSCOPE) profile $(FAMILY_$(m)) $(NPROC_FLAG) --backend $(BACKEND) --seed $$s $(RUN_FLAGS) $(ARGS) || exit $$?;) \
	done

# Your own script, unchanged (docs/guides/own-script.md):
#   make profile-script SCRIPT=train.py SCRIPT_ARGS="--epochs 1" MODE=ddp NPROC=2
SCRIPT      ?=
SCRIPT_ARGS ?=
MODE        ?= single
profile-script: setup
	@if [ -z "$(SCRIPT)" ]; then echo "make profile-script: set SCRIPT=path/to/train.py (and SCRIPT_ARGS=\"...\")" >&2; exit 2; fi
	$(PY) -m workloads.launch --script "$(SCRIPT)" --mode $(MODE) $(NPROC_FLAG) --runs-dir "$(RUNS)" \
	    $(PROFILE_FLAGS) $(ARGS) -- $(SCRIPT_ARGS)

# RUNS is one folder (spaces allowed) or, when no such folder exists, several separated by spaces.
report: setup
	@if [ -d "$(RUNS)" ]; then set -- "$(RUNS)"; else set -- $(RUNS); fi; \
	    $(DPSCOPE) report "$$@" --out "$(REPORT_DIR)"

# `dpscope demo`: smallcnn, 24 steps, every mode as interleaved rounds until the speedup is known
# (--repeat auto; FSDP2 beside DDP), a 1-rank DDP run and a short comm benchmark, then the report
# (README: the measured time). MODEL, STEPS, SEEDS, MODES, REPEAT or REPEAT_BUDGET_S given on the
# command line win over the demo's own defaults.
cmdline = $(filter command line,$(origin $(1)))
demo: setup
	$(DPSCOPE) demo --runs-dir "$(RUNS)" --out "$(REPORT_DIR)" $(NPROC_FLAG) --backend $(BACKEND) \
	    --dataset $(DATASET) --epochs $(EPOCHS) --batch-size $(BATCH) $(PROFILE_FLAGS) \
	    $(if $(call cmdline,MODEL),--model $(MODEL)) $(if $(call cmdline,STEPS),--max-steps $(STEPS)) \
	    $(if $(call cmdline,SEEDS),--seeds "$(SEEDS)") $(if $(call cmdline,MODES),--modes "$(MODES)") \
	    $(if $(call cmdline,REPEAT),--repeat $(REPEAT)) \
	    $(if $(call cmdline,REPEAT_BUDGET_S),--repeat-budget-s $(REPEAT_BUDGET_S)) $(ARGS)

tensorboard: setup
	$(DPSCOPE) tensorboard "$(RUNS)" --port $(PORT)

bench-analysis: setup
	$(PY) -m pip install -q -r requirements-bench.txt
	$(PY) -m bench.analysis $(if $(filter %.json,$(BENCH_OUT)),,$(if $(BENCH_OUT),--json $(BENCH_OUT)))
	$(PY) -m bench.scaling $(if $(BENCH_OUT),--json $(BENCH_OUT))

hta-orphans-reference: setup
	$(PY) -m pip install -q -r requirements-bench.txt
	$(PY) -m bench.orphan_edit

# The GPU checks are gpu-marked tests (tests/test_gpu.py, skipped with the reason without CUDA);
# their run folders stay in RUNS/gpu-check. `python -m workloads.tools.gpu_check` still works.
gpu-check: setup
	$(PY) -m pytest -m gpu -v tests/test_gpu.py --gpu-runs-dir "$(RUNS)/gpu-check"

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: setup
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# Everything (README: its measured time); test-fast: the tests that start no process.
# Every test not marked `serial` on FAST_WORKERS processes, each test file on one worker (so its
# module fixtures launch once), then the `serial` ones alone: their bounded waits (hangs, watchdogs,
# restarts) and load measurements (quiet steps, host load, clock offsets) hold on a machine
# loaded only by them.
test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not serial" -n $(FAST_WORKERS) --dist loadfile --durations=15
	$(PY) -m pytest -q -m serial --durations=10

# The fast tier in FAST_WORKERS processes (pytest-xdist): its tests start no process and each
# worker copies the golden runs into its own temporary folder, so two cores run it in about half
# the time.
FAST_WORKERS ?= 2
test-fast: setup
	$(PY) -m pytest -q -m "not integration" -n $(FAST_WORKERS)

# The committed golden run set (tests/data/golden/: single, 2-rank DDP, comm and failed runs made
# by the real launcher with tiny settings) that the analysis and report tests read. Re-run it
# after a change of the run-folder format (tests/test_golden.py says when) and commit the folder.
golden: setup
	$(PY) -m bench.golden

# The whole suite beside a CPU hog on every core (bench/cpuhog.py, on HOG_DUTY of each second):
# it stops when the suite ends, or after HOG_DEADLINE_S whatever happens. CI runs plain `test`.
HOG_DUTY ?= 1
HOG_DEADLINE_S ?= 5400
test-load: setup
	$(PY) -m bench.cpuhog --duty $(HOG_DUTY) --deadline-s $(HOG_DEADLINE_S) \
	    --json $(if $(filter %.json,$(BENCH_OUT)),$(BENCH_OUT),$(or $(BENCH_OUT),reports/bench)/suite_load.json) \
	    -- $(PY) -m pytest $(ARGS)

# docs/reference/cli.md from the argparse parsers, docs/benchmarks.md from reports/bench/*.json.
docs: setup
	$(PY) -m bench.docs

clean:
	rm -rf "$(RUNS)" $(filter-out $(REPORT_DIR)/README.md,$(wildcard $(REPORT_DIR)/*)) .pytest_cache .ruff_cache

# --- DDP tuning (make tune-ddp): workloads.tools.tune measures the DDP knobs on this workload ------
# STEPS defaults to 30 here unless given on the command line or in the environment.
TRIALS          ?= 3
TUNE_ACCUM      ?= 0
TUNE_BUDGET_S   ?= 0
TUNE_CANDIDATES ?=
TUNE_STEPS = $(if $(filter command line environment,$(origin STEPS)),$(STEPS),30)

.PHONY: tune-ddp
tune-ddp: setup
	$(DPSCOPE) tune --model $(MODEL) --dataset $(DATASET) --batch-size $(BATCH) \
	    $(NPROC_FLAG) --backend $(BACKEND) --epochs $(EPOCHS) --max-steps $(TUNE_STEPS) \
	    --trials $(TRIALS) --budget-s $(TUNE_BUDGET_S) $(if $(filter 1,$(TUNE_ACCUM)),--accum) \
	    --candidates "$(TUNE_CANDIDATES)" --runs-dir "$(RUNS)" $(ARGS)

# --- collective benchmark and scaling projection (issue 9) ----------------------------------
# COMM_SIZES: explicit byte sizes ("1024 1048576"); else powers of 2 from 4 B to COMM_MAX bytes
# (empty: 64 MiB on GPU, 16 MiB on CPU). COMM_ITERS timed iterations per size after COMM_WARMUP.
# COMM_GAPS_MS: the idle-penalty sweep's compute gaps (ms; empty: 0 1 3 10 30 100; none: no sweep),
# COMM_GAP_ITERS timed iterations per size and gap; COMM_COLLECTIVES: some of the five (default all).
COMM_GAPS_MS ?=
COMM_GAP_ITERS ?= 5
COMM_COLLECTIVES ?=
COMM_SIZES  ?=
COMM_MAX    ?=
COMM_ITERS  ?= 20
COMM_WARMUP ?= 5
.PHONY: bench-comm bench-projection
bench-comm: setup
	$(DPSCOPE) bench-comm $(NPROC_FLAG) --backend $(BACKEND) --runs-dir "$(RUNS)" \
	    --iters $(COMM_ITERS) --warmup $(COMM_WARMUP) $(if $(strip $(COMM_MAX)),--max-bytes $(COMM_MAX)) \
	    $(if $(strip $(COMM_SIZES)),--sizes "$(COMM_SIZES)") \
	    $(if $(strip $(COMM_GAPS_MS)),--gaps-ms "$(COMM_GAPS_MS)") --gap-iters $(COMM_GAP_ITERS) \
	    $(if $(strip $(COMM_COLLECTIVES)),--collectives "$(COMM_COLLECTIVES)") $(ARGS)
bench-projection: setup
	$(PY) -m bench.projection --runs-dir "$(RUNS)/bench-projection" $(ARGS)

# --- benchmarks (issue 8): every arm in one run, interleaved, >= 3 repeats, medians and ratios ---
# BENCH_OUT: a .json file, or a folder for <folder>/<name>.json (default reports/bench/<name>.json).
BENCH_OUT ?=
.PHONY: bench bench-overhead

bench: bench-overhead bench-analysis

bench-overhead: setup
	$(PY) -m bench.overhead $(if $(BENCH_OUT),--json $(BENCH_OUT))

# --- scaling sweep (README: Scaling sweeps) ---------------------------------------------------
# NPROCS empty: powers of two up to the GPU count (1 2 on CPU); given empty on the command line
# (`NPROCS=`) it is an error rather than a silent default. MODES: some of single dp ddp zero1 fsdp
# (profile-all and the demo take the same words).
NPROCS   ?=
MODES    ?= single dp ddp
BACKENDS ?= nccl gloo
SCALING  ?= strong
SWEEP    ?=
.PHONY: profile-sweep
profile-sweep: setup
	$(DPSCOPE) sweep $(if $(filter command line,$(origin NPROCS)),--nprocs "$(NPROCS)") \
	    --modes "$(MODES)" --backends "$(BACKENDS)" --seeds "$(SEEDS)" --scaling "$(SCALING)" \
	    $(if $(SWEEP),--sweep "$(SWEEP)") $(RUN_FLAGS) $(ARGS)

# --- the data-parallel family (issue 30): FSDP2, ZeRO-1 and DDP throughput and peak memory for gpt,
# interleaved, with the host's load average recorded; written to docs/benchmarks.md by `make docs`.
.PHONY: bench-family
bench-family: setup
	$(PY) -m bench.family --out $(if $(filter %.json,$(BENCH_OUT)),$(BENCH_OUT),$(or $(BENCH_OUT),reports/bench)/family.json) $(ARGS)
# `make demo` beside a bursty CPU hog (load about 4 on 2 cores); BEFORE=DIR also runs the dpscope
# checked out in DIR, for a before/after pair (docs/benchmarks.md).
BEFORE ?=
.PHONY: bench-demo-load
bench-demo-load: setup
	$(PY) -m bench.demo_load $(if $(BEFORE),--before "$(BEFORE)") $(if $(BENCH_OUT),--json $(BENCH_OUT)) $(ARGS)

.PHONY: bench-report
bench-report: setup
	$(PY) -m bench.report --out $(if $(filter %.json,$(BENCH_OUT)),$(BENCH_OUT),$(or $(BENCH_OUT),reports/bench)/report.json)
