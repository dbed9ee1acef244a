"""`make tune-ddp` (`python -m workloads.tools.tune`): measure the DDP knobs on the user's own workload
and say which to use.

A baseline (the workload as given: MODEL, DATASET, BATCH, NPROC, BACKEND, ARGS) and one candidate
per knob (`--bucket-cap-mb` 1/5/25/100, `--gradient-as-bucket-view`, `--static-graph`,
`--comm-hook` fp16/bf16/powersgd, and with `--accum` `--grad-accum-steps` 2/4) each run TRIALS
times through the real launcher, profiler off, in rounds: every round runs the baseline and every
candidate once, in a shuffled order, so machine noise hits every arm alike. Then the knobs that
helped are combined greedily (workloads.tools.tune_stats.greedy_order), each combination measured the
same way against its own interleaved baseline trials. Everything lands in `runs/tune-<id>/`:
every trial's run folder and `tune.json` (rewritten atomically after each trial).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from profiler.runfolder.atomic import write_json_atomic
from profiler.runfolder.errors import InputError, disk_writes, run_command
from profiler.runfolder.layout import RUN_JSON, STEPS_CSV, utc_now
from profiler.runfolder.records import read_record
from profiler.runfolder.steps import read_steps
from profiler.runfolder.versions import TUNE_JSON_SCHEMA_VERSION
from workloads.launch.child import child_env, user_path
from workloads.tools import tune_stats
from workloads.tools.tune_output import command_lines, print_table
from workloads.tools.tune_plan import Knob, TuneError, build_parser, prepare

__all__ = ["Tuner", "main"]

WINDOWS = os.name == "nt"


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the tuner: handled as Ctrl-C is (the trial is stopped, tune.json says
    `interrupted`)."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored inside the block (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises Terminated inside the block (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _stop_tree(proc: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the trial's whole process group (POSIX); end its process tree on Windows."""
    if WINDOWS:
        subprocess.run(["taskkill", "/F", "/T", "/PID", str(proc.pid)], capture_output=True)
    else:
        os.killpg(proc.pid, sig)


def _losses(run_dir: Path) -> dict[int, float]:
    """Per-step global loss of a run: the mean over ranks of steps.csv `loss`."""
    per_step: dict[int, list[float]] = {}
    try:
        rows = read_steps(run_dir / STEPS_CSV)
    except InputError:
        return {}
    if any(r.loss is None for r in rows):
        return {}  # a row without a loss: no loss comparison, as for an unreadable file
    for r in rows:
        per_step.setdefault(r.step, []).append(float(r.loss))
    return {s: sum(v) / len(v) for s, v in per_step.items()}


def _arm(name: str, args: tuple[str, ...], *, group: str, lossy: bool, stage: str) -> dict:
    return {
        "name": name,
        "args": list(args),
        "group": group,
        "lossy": lossy,
        "stage": stage,
        "status": "pending",
        "reason": None,
        "trials": [],
    }


class Tuner:
    """Runs the trials, keeps tune.json current, and picks the best setting."""

    def __init__(self, opts: argparse.Namespace, workload: dict, launcher_argv: list[str]) -> None:
        self.opts = opts
        self.dir = Path(opts.runs_dir) / opts.tune_id
        self.launcher_argv = launcher_argv
        self.start = time.monotonic()
        self.durations: list[float] = []
        self.stop_reason: str | None = None
        self.record = {
            "schema_version": TUNE_JSON_SCHEMA_VERSION,
            "kind": "dpscope-tune",
            "tune_id": opts.tune_id,
            "status": "running",
            "created_at": utc_now(),
            "finished_at": None,
            "workload": workload,
            "rules": {
                "speedup": "median candidate samples/s / median baseline samples/s (interleaved trials)",
                "significance": f"exact two-sided Mann-Whitney test of the candidate's trials vs the "
                f"baseline's, significant when p <= {opts.alpha}",
                "alpha": opts.alpha,
                "loss_tolerance": opts.loss_tolerance,
                "loss": "largest |candidate - baseline| per-step global training loss (steps.csv)",
            },
            "baseline": _arm("baseline", (), group="baseline", lossy=False, stage="single"),
            "candidates": [],
            "best": None,
            "command": None,
            "launcher_command": None,
            "stopped_early": False,
            "stop_reason": None,
            "elapsed_s": 0.0,
        }
        self.bar = tqdm(
            total=0, unit="trial", desc="tune", disable=not opts.progress, file=sys.stderr
        )

    def save(self) -> None:
        self.record["elapsed_s"] = time.monotonic() - self.start
        write_json_atomic(self.dir / "tune.json", self.record)

    def _out_of_budget(self) -> bool:
        if not self.stop_reason:
            self.stop_reason = tune_stats.budget_stop_reason(
                time.monotonic() - self.start, self.durations, self.opts.budget_s
            )
        return self.stop_reason is not None

    def trial(self, arm: dict, label: str, round_: int) -> dict | None:
        """Run one trial of `arm` through the launcher; record it; None when out of budget."""
        if self._out_of_budget():
            return None
        run_id = f"{label}-t{round_}"
        argv = [*self.launcher_argv, *arm["args"], "--runs-dir", str(self.dir), "--run-id", run_id]
        self.bar.set_postfix_str(run_id, refresh=True)
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "workloads.launch", *argv],
            env=child_env(PYTHONUNBUFFERED="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # Its own process group, so a timeout or Ctrl-C can end torchrun and its ranks too.
            **({"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP} if WINDOWS else {}),
            start_new_session=not WINDOWS,
        )
        try:
            output, _ = proc.communicate(timeout=self.opts.trial_timeout_s or None)
            timed_out = False
        except subprocess.TimeoutExpired:
            _stop_tree(proc, signal.SIGTERM)
            output, _ = proc.communicate()
            timed_out = True
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated) to the tuner
            _stop_tree(proc, signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
            proc.communicate()
            raise
        duration = time.monotonic() - started
        self.durations.append(duration)
        result = {
            "run_id": run_id,
            "round": round_,
            "status": "failed",
            "samples_per_s": None,
            "duration_s": round(duration, 3),
            "error": None,
        }
        try:
            run, _ = read_record(self.dir / run_id / RUN_JSON)
        except InputError:
            run = None
        sps = run.metrics.samples_per_s if run else None
        if proc.returncode == 0 and run and run.status == "ok" and sps is not None:
            result.update(status="ok", samples_per_s=float(sps))
        elif timed_out:
            result["error"] = f"timed out after {self.opts.trial_timeout_s} s (--trial-timeout-s)"
        else:
            lines = [ln for ln in (output or "").splitlines() if ln.strip()]
            error = run.error.message if run and run.error else None
            result["error"] = error or (lines[-1] if lines else f"exit code {proc.returncode}")
        arm["trials"].append(result)
        self.bar.update(1)
        self.save()
        return result

    def rounds(self, arms: list[tuple[dict, str]], trials: int, seed: str) -> None:
        """`trials` rounds; each runs every arm once, in a shuffled (seeded) order."""
        for r in range(1, trials + 1):
            order = list(arms)
            random.Random(f"{seed}-{r}").shuffle(order)
            for arm, label in order:
                if self.trial(arm, label, r) is None:
                    return

    def refresh(self, arm: dict, baseline_trials: list[dict], baseline_dir: Path | None) -> None:
        """Recompute an arm's statistics against the baseline trials it was interleaved with."""
        ok = [t for t in arm["trials"] if t["status"] == "ok"]
        base = [t["samples_per_s"] for t in baseline_trials if t["status"] == "ok"]
        arm.update(
            tune_stats.compare([t["samples_per_s"] for t in ok], base, alpha=self.opts.alpha)
        )
        diff = None
        if ok and baseline_dir is not None:
            diff = tune_stats.loss_max_abs_diff(
                _losses(self.dir / ok[0]["run_id"]), _losses(baseline_dir)
            )
        arm["loss_max_abs_diff"] = diff
        arm["loss_flagged"] = diff is not None and diff > self.opts.loss_tolerance
        done = len(arm["trials"])
        if arm["status"] == "skipped":
            return
        if not done:
            arm.update(status="not_run", reason=self.stop_reason or "not reached")
        elif not ok:
            arm.update(status="failed", reason=arm["trials"][-1]["error"])
        elif done < self.opts.trials:
            arm.update(
                status="partial", reason=f"{done} of {self.opts.trials} trials ({self.stop_reason})"
            )
        else:
            failed = done - len(ok)
            arm.update(status="ok", reason=f"{failed} trial(s) failed" if failed else None)

    def _first_ok_dir(self, trials: list[dict]) -> Path | None:
        ok = [t for t in trials if t["status"] == "ok"]
        return self.dir / ok[0]["run_id"] if ok else None

    def run(self, knobs: list[Knob], skipped: dict[str, str]) -> dict:
        opts, rec = self.opts, self.record
        base = rec["baseline"]
        for k in knobs:
            arm = _arm(k.name, k.args, group=k.group, lossy=k.lossy, stage="single")
            arm["note"] = k.note
            if k.name in skipped:
                arm.update(status="skipped", reason=skipped[k.name])
            rec["candidates"].append(arm)
        singles = [a for a in rec["candidates"] if a["status"] != "skipped"]
        self.bar.total = (len(singles) + 1) * opts.trials
        self.save()
        try:
            self.rounds(
                [(base, "baseline"), *((a, a["name"]) for a in singles)], opts.trials, opts.seed
            )
            if not self.stop_reason:
                self._greedy(singles)
            rec["status"] = "stopped_early" if self.stop_reason else "ok"
        except KeyboardInterrupt as exc:
            how = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
            rec["status"], self.stop_reason = "interrupted", f"interrupted ({how})"
        finally:
            self.bar.close()
        with _signals_ignored():  # tune.json is written whole, whatever arrives now
            self._finish()
        return rec

    def _refresh_all(self) -> None:
        rec = self.record
        base = rec["baseline"]
        self.refresh(base, base["trials"], None)
        ok = [t for t in base["trials"] if t["status"] == "ok"]
        # The baseline's own row: run-to-run spread only, and its loss noise floor (trials 2.. vs 1).
        for key in ("speedup_vs_baseline", "speedup_min", "speedup_max", "p_value", "significant"):
            base.pop(key, None)
        ref = _losses(self.dir / ok[0]["run_id"]) if ok else {}
        diffs = [tune_stats.loss_max_abs_diff(_losses(self.dir / t["run_id"]), ref) for t in ok[1:]]
        base["loss_max_abs_diff"] = max((d for d in diffs if d is not None), default=None)
        base.pop("loss_flagged", None)
        for arm in rec["candidates"]:
            trials = base["trials"] if arm["stage"] == "single" else arm["baseline_trials"]
            self.refresh(arm, trials, self._first_ok_dir(trials))

    def _greedy(self, singles: list[dict]) -> None:
        """Add the knobs that helped one at a time to the best one; keep each that raises the
        median speedup and is itself significant against its interleaved baseline trials
        (tune_stats.greedy_combine decides; this only runs the trials)."""
        self._refresh_all()
        best = tune_stats.greedy_combine(tune_stats.greedy_order(singles), self._measure_combo)
        if best is not None:
            self.record["best_arm"] = best["name"]

    def _measure_combo(self, spec: dict, step: int) -> tuple[dict, bool]:
        """Run a combination's trials interleaved with baseline trials of its own; returns its
        arm with statistics, and whether the budget ran out."""
        combo = _arm(spec["name"], spec["args"], group="combo", lossy=spec["lossy"], stage="combo")
        combo["baseline_trials"] = []
        holder = {"args": [], "trials": combo["baseline_trials"]}  # the workload as given
        self.record["candidates"].append(combo)
        self.bar.total += 2 * self.opts.trials
        self.bar.refresh()
        self.rounds(
            [(holder, f"combo{step}-baseline"), (combo, f"combo{step}")],
            self.opts.trials,
            f"{self.opts.seed}-combo{step}",
        )
        self._refresh_all()
        return combo, self.stop_reason is not None

    def _finish(self) -> None:
        rec = self.record
        self._refresh_all()
        singles = [a for a in rec["candidates"] if a["stage"] == "single"]
        order = tune_stats.greedy_order(singles)
        best_name = rec.pop("best_arm", None) or (order[0]["name"] if order else None)
        best = next((a for a in rec["candidates"] if a["name"] == best_name), None)
        if best is not None:
            rec["best"] = {
                k: best[k]
                for k in ("name", "args", "speedup_vs_baseline", "samples_per_s_median", "p_value")
            }
        rec["command"], rec["launcher_command"] = command_lines(
            rec["workload"], best["args"] if best else []
        )
        rec["stopped_early"] = self.stop_reason is not None
        rec["stop_reason"] = self.stop_reason
        rec["finished_at"] = utc_now()
        self.save()


def main(argv: list[str] | None = None, *, prog: str = "python -m workloads.tools.tune") -> int:
    opts, extra = build_parser(prog).parse_known_args(argv)
    opts.runs_dir = str(user_path(opts.runs_dir))  # the trials' launchers get it absolute
    return run_command(prog, lambda: _tune(opts, extra))


def _tune(opts: argparse.Namespace, extra: list[str]) -> int:
    workload, launcher_argv, knobs, skipped = prepare(opts, extra)
    tune_dir = Path(opts.runs_dir) / opts.tune_id
    if Path(opts.runs_dir).exists() and not Path(opts.runs_dir).is_dir():
        raise TuneError(f"RUNS ({opts.runs_dir}) is not a folder; point RUNS at a folder")
    with disk_writes(tune_dir):
        Path(opts.runs_dir).mkdir(parents=True, exist_ok=True)
        try:
            tune_dir.mkdir()  # exclusive: two tuners never share a folder
        except FileExistsError:
            raise TuneError(
                f"{tune_dir} already exists; pick another --tune-id or remove it"
            ) from None
    with _sigterm_interrupts():
        record = Tuner(opts, workload, launcher_argv).run(knobs, skipped)
    print_table(record, tune_dir)
    if record["status"] == "interrupted":
        return 130
    return 0 if any(t["status"] == "ok" for t in record["baseline"]["trials"]) else 1


if __name__ == "__main__":
    sys.exit(main())
