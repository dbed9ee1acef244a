"""Hostile input, class 5 (output safety): JSON output always valid and only to regular files or
new paths; output paths checked before any work; the report never removes or replaces what it
did not write, and any interruption leaves the previous report whole."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
import shutil
from pathlib import Path

import psutil
import pytest

from analysis.cli.main import main as analysis_main
from analysis.jsonsafe import finite_json
from analysis.report.__main__ import main as report_main
from tests.conftest import in_process, read_run
from tests.hostile_common import (
    EVENT_CASES,
    cli,
    ddp_traces,  # noqa: F401  (fixture)
    strict_json,
    with_bad_rank1,
)


def test_non_finite_values_become_null_with_a_warning():
    warnings: list[str] = []
    out = finite_json({"a": math.inf, "b": [1.0, math.nan], "c": {"d": -math.inf}}, warnings)
    assert out == {"a": None, "b": [1.0, None], "c": {"d": None}}
    assert sorted(w.split("`")[1] for w in warnings) == ["a = inf", "b[1] = nan", "c.d = -inf"]
    json.dumps(out, allow_nan=False)


def test_huge_dur_gives_valid_json_from_the_cli(tmp_path, ddp_traces):
    (tmp_path / "t").mkdir()
    with_bad_rank1(tmp_path / "t", ddp_traces, EVENT_CASES["huge-dur"])
    out = tmp_path / "t.json"
    args = ["traces", str(tmp_path / "t"), "--json", str(out), "--no-progress"]
    proc = in_process(analysis_main, args)
    assert proc.returncode == 0, proc.stderr
    data = strict_json(out.read_text())
    assert all(r["step_time_us_mean"] < 1e12 for r in data["ranks"])
    assert any("impossible times" in w for w in data["warnings"])


@pytest.mark.parametrize("target", [".", "/", "", "input"])
@pytest.mark.integration
def test_bad_json_out_is_refused_before_work(target, tmp_path, ddp_traces, capsys):
    d = tmp_path / "traces"
    d.mkdir()
    for f in ddp_traces:
        shutil.copy(f, d / f.name)
    trace = d / ddp_traces[0].name
    before = trace.read_bytes()
    out = str(trace) if target == "input" else target
    assert analysis_main(["traces", str(d), "--json", out, "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "cannot write the JSON" in line and "--json" in line
    assert trace.read_bytes() == before


def test_json_out_inside_a_run_folder_is_refused(tmp_path, single_mlp_run, capsys):
    run = tmp_path / "single"
    shutil.copytree(single_mlp_run, run)
    before = (run / "run.json").read_bytes()
    assert analysis_main(["runs", str(run), "--json", str(run / "run.json"), "--no-traces"]) == 2
    assert "cannot write the JSON" in capsys.readouterr().err
    assert (run / "run.json").read_bytes() == before


@pytest.mark.parametrize("target", ["", ".", "/", "file", "input", "inside-run"])
def test_bad_report_out_is_refused_before_work(target, tmp_path, single_mlp_run, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(single_mlp_run, runs / "single")
    (tmp_path / "file").write_text("keep")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("keep")
    out = {
        "file": tmp_path / "file",
        "input": runs,
        "inside-run": runs / "single" / "report",
    }.get(target, target)
    assert report_main([str(runs), "--out", str(out), "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "cannot write the report" in line and "--out" in line
    assert (runs / "single" / "run.json").is_file() and not (runs / "single" / "report").exists()
    assert (tmp_path / "file").read_text() == "keep"
    assert (tmp_path / "foreign" / "notes.txt").read_text() == "keep"


def test_report_into_a_folder_with_other_files_keeps_them(tmp_path, single_mlp_run):
    """`make report` writes into reports/, which holds the project's README.md and bench/: the
    report swaps in its own files only, and a second report removes what the first wrote and
    the second does not (from the first one's manifest), never a foreign file."""
    runs = tmp_path / "runs"
    shutil.copytree(single_mlp_run, runs / "single")
    out = tmp_path / "reports"
    (out / "bench").mkdir(parents=True)
    (out / "README.md").write_text("keep")
    (out / "bench" / "overhead.json").write_text("{}")
    assert report_main([str(runs), "--out", str(out), "--no-progress"]) == 0
    assert (out / "index.html").is_file() and (out / "README.md").read_text() == "keep"
    (out / "stale.csv").write_text("old")  # as if the previous report had written it
    manifest = out / ".dpscope-report.json"
    listed = json.loads(manifest.read_text())
    listed["files"]["stale.csv"] = hashlib.sha256(b"old").hexdigest()
    manifest.write_text(json.dumps(listed))
    assert report_main([str(runs), "--out", str(out), "--no-progress"]) == 0
    assert not (out / "stale.csv").exists()
    assert (out / "README.md").read_text() == "keep" and (out / "bench" / "overhead.json").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".report-")]  # no staging left


@pytest.mark.skipif(os.name != "posix", reason="RLIMIT_FSIZE is POSIX-only")
@pytest.mark.integration
def test_failed_report_write_leaves_the_previous_report_whole(tmp_path):
    """A real write failure part-way (the file-size limit hit on index.html, after the CSVs and
    summary.json were written): the error names the file and the previous report is untouched."""
    import resource
    import signal

    from analysis.report.outfolder import replace_folder

    out = tmp_path / "report"
    files = {"summary.csv": "a\n1\n", "summary.json": "{}\n", "index.html": "new" * 100_000}
    replace_folder({**files, "index.html": "old"}, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, 64_000))

    code = (
        "import json, sys; from pathlib import Path\n"
        "from analysis.report.build import ReportError\nfrom analysis.report.outfolder import replace_folder\n"
        "files = json.loads(sys.argv[2]); files['index.html'] *= 100_000\n"
        "try: replace_folder(files, Path(sys.argv[1]))\n"
        "except ReportError as e: sys.exit(f'report: {e}')\n"
    )
    arg = json.dumps({**files, "index.html": "new"})  # a 300 kB argument would be too long
    proc = cli("-c", code, str(out), arg, preexec_fn=limit)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "(index.html)" in line and "File too large" in line
    assert "previous report is unchanged" in line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no staging folder left


def _report_twice_setup(tmp_path: Path, single_mlp_run: Path) -> tuple[list[str], Path]:
    runs = tmp_path / "runs"
    shutil.copytree(single_mlp_run, runs / "single", ignore=shutil.ignore_patterns("traces"))
    out = tmp_path / "report"
    args = [str(runs), "--out", str(out), "--no-progress"]
    assert report_main(args) == 0
    return args, out


@pytest.mark.parametrize("form", ["list", "hashes-of-other-content", "paths", "not-json"])
def test_tampered_manifest_never_removes_the_users_files(form, tmp_path, single_mlp_run):
    """The manifest is untrusted: listing the user's NOTES.txt / README.md (as an old list, with
    wrong hashes, as paths out of the folder, or garbage) never makes the report delete them."""
    args, out = _report_twice_setup(tmp_path, single_mlp_run)
    (out / "NOTES.txt").write_text("mine")
    (out / "README.md").write_text("mine too")
    (tmp_path / "outside.txt").write_text("keep")
    wrong = hashlib.sha256(b"something else").hexdigest()
    manifest = {
        "list": ["NOTES.txt", "README.md", "index.html"],
        "hashes-of-other-content": {"files": {"NOTES.txt": wrong, "README.md": wrong}},
        "paths": {"files": {"../outside.txt": hashlib.sha256(b"keep").hexdigest()}},
        "not-json": "{" * 10,
    }[form]
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    (out / ".dpscope-report.json").write_text(text)
    assert report_main(args) == 0
    assert (out / "NOTES.txt").read_text() == "mine" and (
        out / "README.md"
    ).read_text() == "mine too"
    assert (tmp_path / "outside.txt").read_text() == "keep" and (out / "index.html").is_file()


@pytest.mark.parametrize("kind", ["folder", "fifo", "symlink"])
def test_a_non_regular_file_under_a_report_name_is_refused(kind, tmp_path, single_mlp_run, capsys):
    """A folder named index.html (with the user's files in it), a FIFO or a link named
    summary.csv: the report refuses with one line and touches nothing."""
    runs = tmp_path / "runs"
    shutil.copytree(single_mlp_run, runs / "single", ignore=shutil.ignore_patterns("traces"))
    out = tmp_path / "report"
    out.mkdir()
    (tmp_path / "target.txt").write_text("keep")
    name = "index.html" if kind == "folder" else "summary.csv"
    if kind == "folder":
        (out / name).mkdir()
        (out / name / "notes.txt").write_text("keep")
    elif kind == "fifo":
        os.mkfifo(out / name)
    else:
        (out / name).symlink_to(tmp_path / "target.txt")
    assert report_main([str(runs), "--out", str(out), "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"({name})" in line and "not a regular file" in line
    assert (tmp_path / "target.txt").read_text() == "keep"
    if kind == "folder":
        assert (out / name / "notes.txt").read_text() == "keep"
    assert sorted(p.name for p in out.iterdir()) == [name]  # no staging or backup left


@pytest.mark.parametrize("at", [1, 3, 6])
def test_ctrl_c_inside_the_swap_leaves_the_previous_report_whole(at, tmp_path, monkeypatch):
    """KeyboardInterrupt raised by the k-th rename of the swap (as a real Ctrl-C there would):
    every file of the previous report is back, byte for byte, and nothing is staged."""
    from analysis.report import outfolder
    from analysis.report.outfolder import replace_folder

    out = tmp_path / "report"
    old = {"a.csv": "a\n1\n", "summary.json": "{}\n", "index.html": "old"}
    replace_folder(old, out)
    (out / "README.md").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == at:
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(outfolder.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        replace_folder({"b.csv": "b\n", "summary.json": "[]\n", "index.html": "new"}, out)
    monkeypatch.setattr(outfolder.os, "replace", real)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_out_folder_name_too_long_is_one_line_and_creates_nothing(tmp_path):
    """--out under a folder whose name is too long for the file system (ENAMETOOLONG): one
    ReportError line naming it, and no folder left behind (the new folders' check included)."""
    from analysis.report.build import ReportError
    from analysis.report.outfolder import replace_folder

    out = tmp_path / "new" / ("a" * 300) / "report"
    with pytest.raises(ReportError, match=r"cannot write the report into .*File name too long"):
        replace_folder({"index.html": "x"}, out)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("previous", [True, False], ids=["over-a-report", "into-a-new-folder"])
def test_ctrl_c_says_what_it_left(previous, tmp_path, single_mlp_run, monkeypatch, capsys):
    """Ctrl-C at the report's first rename, after the whole analysis: the line says the previous
    report is whole only where there was one, and a first report leaves no folder behind."""
    from analysis.report import outfolder

    if previous:
        args, out = _report_twice_setup(tmp_path, single_mlp_run)
    else:
        out = tmp_path / "report"
        args = [str(single_mlp_run.parent), "--out", str(out), "--no-progress"]
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(outfolder.os, "replace", interrupted)
    assert report_main(args) == 130
    err = capsys.readouterr().err
    left = (
        f"the previous report in {out} is whole" if previous else f"no report was written to {out}"
    )
    assert err == f"python -m analysis.report: interrupted (Ctrl-C) — {left}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no folder, no temp left


@pytest.mark.integration
@pytest.mark.parametrize("cpu_s", [0.2, 1.0], ids=["while-loading", "while-analysing"])
def test_real_sigint_gives_one_line_and_keeps_the_previous_report(cpu_s, tmp_path, single_mlp_run):
    """A real SIGINT to `python -m analysis.report` while its libraries load (pandas: the first
    0.2 CPU s) or while it analyses: exit 130, one line, the previous report byte for byte."""
    import signal
    import subprocess
    import sys
    import time

    args, out = _report_twice_setup(tmp_path, single_mlp_run)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "analysis.report", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    # Once it has done cpu_s of CPU work, polled with a bound rather than a fixed sleep a loaded
    # machine would outrun.
    child, deadline = psutil.Process(proc.pid), time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if sum(child.cpu_times()[:2]) >= cpu_s:
                break
        except psutil.Error:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    if proc.returncode == 0:  # it finished first on a fast machine: a new report, whole
        assert (out / "index.html").is_file()
        return
    assert proc.returncode in (130, -signal.SIGINT), err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
@pytest.mark.parametrize("target", ["device", "fifo"])
def test_json_out_only_to_regular_files_or_new_paths(target, tmp_path, single_mlp_run, capsys):
    out = Path("/dev/null") if target == "device" else tmp_path / "pipe"
    if target == "fifo":
        os.mkfifo(out)
    argv = ["runs", str(single_mlp_run), "--no-traces", "--no-progress", "--json", str(out)]
    assert analysis_main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "not a regular file" in line and "--json" in line
    assert not out.is_file()


@pytest.mark.parametrize("entry", ["/etc/passwd", "../../secret.txt", "nul", "link"])
def test_report_links_only_files_inside_the_run_folder(entry, tmp_path, single_mlp_run):
    """run.json `traces` entries out of the run folder (absolute, `..`, a link leading out) or
    with a NUL are one warning each and never a link; the run's own traces stay linked."""
    run = tmp_path / "runs" / "single"
    shutil.copytree(single_mlp_run, run)
    (tmp_path / "secret.txt").write_text("x")
    (run / "link.txt").symlink_to(tmp_path / "secret.txt")
    rec = read_run(run)
    name = {"link": "link.txt", "nul": "traces/a\x00b"}.get(entry, entry)
    rec["traces"] = [*rec["traces"], name]
    (run / "run.json").write_text(json.dumps(rec))
    out = tmp_path / "report"
    assert report_main([str(tmp_path / "runs"), "--out", str(out), "--no-progress"]) == 0
    html = (out / "index.html").read_text(encoding="utf-8")
    hrefs = re.findall(r'href="([^"]*)"', html)
    assert not [h for h in hrefs if "passwd" in h or "secret" in h or "link.txt" in h]
    assert sum("pt.trace.json" in h for h in hrefs) == len(read_run(single_mlp_run)["traces"])
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert "not a file inside the run folder" in rows[0]["reason"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs"][0]["trace_files"] == read_run(single_mlp_run)["traces"]
