"""The run-folder contract: the one torch-free package both halves of dpscope share.

`workloads/` and the torch instruments of `profiler/` write run folders through it; `analysis/`
reads them through it and imports nothing else of `profiler/` (tests/test_layering.py). It imports
nothing first-party outside itself. Its modules:

- `layout`: file names, the steps.csv and comm.csv columns, the trace file name template, the
  step phases, the nccl-tests bus model, the writers and the throughput-steps rule;
- `versions`: the schema version of every file kind dpscope writes or reads;
- `schema`: every field of run.json and steps.csv as typed Structs, with their ranges;
- `records`, `steps`, `commcsv`: the readers (run.json, steps.csv, comm.csv), validating once;
- `parts`: the per-rank part files of a `--script` or RunRecorder run and their assembly;
- `stepmetrics`, `commfit`, `hostload`, `quiet`, `rounds`: the rules every writer and reader
  shares (step metrics, the comm run's alpha-beta fit, the busy-machine rule and the host-load
  meters, the quiet-step headline, the bootstrap interval over rounds and when `--repeat auto`
  stops);
- `inputfile`, `atomic`, `errors`: the reading boundary, atomic writes, the error types (the
  disk's refusals as one line too: `DiskError`);
- `lease`: `owner.json`, the exclusive claim of a run folder and the lease that tells a reader
  its launcher was killed.

The format itself: docs/reference/run-folder.md.
"""
