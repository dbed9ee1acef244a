"""The generated pages and the docs' links: docs/reference/cli.md is what the parsers give,
docs/benchmarks.md shows each bench's date, commit and machine, and no page links to a file
that does not exist or names a machine path."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from bench.common import write_json
from bench.docs import CLI_MD, KEPT_HEADING, RUN_FOLDER_MD, benchmarks_md, cli_md, kept_sections
from bench.schemadocs import ROOTS, field_docs, field_tables, reachable, with_field_tables
from tests.conftest import REPO
from workloads.tools.cli import COMMANDS

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_cli_reference_is_current() -> None:
    assert CLI_MD.read_text(encoding="utf-8") == cli_md(), "run `make docs` and commit the result"


def test_run_folder_field_tables_are_current() -> None:
    page = RUN_FOLDER_MD.read_text(encoding="utf-8")
    assert page == with_field_tables(page), "run `make docs` and commit the result"


def test_every_run_folder_field_is_documented_in_its_struct() -> None:
    """Each field of every Struct a run folder's files hold has a docstring, and so a row with a
    meaning in the generated tables."""
    import msgspec.inspect as mi

    missing = [
        f"{cls.__name__}.{f.name}"
        for root in ROOTS
        for cls in reachable(root)
        for f in mi.type_info(cls).fields
        if not field_docs(cls).get(f.name)
    ]
    assert not missing, missing
    text = field_tables()
    for root in ROOTS:
        for cls in reachable(root):
            assert f"### {cls.__name__}\n" in text, cls


def test_cli_reference_has_every_command_and_option() -> None:
    text = cli_md()
    from workloads.tools.cli import command_parser

    for name in COMMANDS:
        assert f"## `dpscope {name}`" in text, name
        for action in command_parser(name)._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help") and action.help != "==SUPPRESS==":
                    assert f"`{flag}`" in text, (name, flag)


@pytest.mark.integration  # the stamp asks git for the commit
def test_benchmarks_page_shows_date_commit_machine_and_results(tmp_path: Path) -> None:
    write_json(tmp_path / "overhead.json", {"unprofiled_steps_ratio": 1.016, "goals": {"x": 1}})
    stamp = json.loads((tmp_path / "overhead.json").read_text())["recorded"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", stamp["date"])
    assert stamp["machine"]["cores"] >= 1
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode == 0:  # a clone: the commit is HEAD's
        assert stamp["commit"] and head.stdout.startswith(stamp["commit"])
    page = benchmarks_md(tmp_path)
    assert "## overhead" in page and f"- date: {stamp['date']}" in page
    assert f"- commit: {stamp['commit'] or 'not recorded'}" in page
    assert f"cores {stamp['machine']['cores']}" in page
    assert "| `unprofiled_steps_ratio` | 1.016 |" in page and "| `goals.x` | 1 |" in page
    assert "No benchmark results" in benchmarks_md(tmp_path / "none")


def test_a_bench_run_alone_keeps_the_other_benches_sections(tmp_path: Path) -> None:
    """`make bench-analysis` then `make docs` on a machine without the other benches' results:
    their sections stay as they were, the new one replaces its own."""
    (tmp_path / "hta.json").write_text(json.dumps({"speedup_vs_hta": 9.5}))
    old = ("# Benchmarks\n\nintro\n\n## family\n\n- date: d\n\n| `x` | 1 |\n\n"
           "## hta\n\n| `speedup_vs_hta` | 7 |\n\n## Test suite\n\n- make test: 1 s\n")  # fmt: skip
    page = benchmarks_md(tmp_path, previous=old)
    assert "## family\n\n- date: d\n\n| `x` | 1 |\n" in page
    assert "| `speedup_vs_hta` | 9.5 |" in page and "| 7 |" not in page
    assert page.index("## family") < page.index("## hta") and KEPT_HEADING not in page
    assert "No benchmark results" not in benchmarks_md(tmp_path / "none", previous=old)


def test_make_docs_keeps_the_hand_recorded_test_suite_section() -> None:
    """The suite's measured times are written by hand at the end of benchmarks.md (## Test
    suite): regenerating the bench sections keeps them, and the committed page has them."""
    page = "# Benchmarks\n\n## overhead\n\nx\n\n## Test suite\n\n- make test: 1 s\n"
    assert kept_sections(page) == "\n## Test suite\n\n- make test: 1 s\n"
    assert kept_sections("# Benchmarks\n") == ""
    committed = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert kept_sections(committed).startswith(f"\n{KEPT_HEADING}\n")


def test_links_resolve_and_no_machine_paths() -> None:
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for target in link.findall(text):
            if not re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                assert (page.parent / target).exists(), f"{page.relative_to(REPO)}: {target}"
        for pattern in (r"/work/", r"/tmp/pytest", r"/home/\w+", r"/root/"):
            assert not re.search(pattern, text), f"{page.relative_to(REPO)}: {pattern}"


def test_make_reference_names_every_target_and_variable() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, re.M))
    variables = set(re.findall(r"^([A-Z_]+)\s*\?=", makefile, re.M))
    page = (REPO / "docs" / "reference" / "make.md").read_text(encoding="utf-8")
    assert targets and variables
    assert not [t for t in sorted(targets) if f"`{t}`" not in page], "document in make.md"
    assert not [v for v in sorted(variables) if f"`{v}`" not in page], "document in make.md"


def test_docs_paths_named_in_code_exist() -> None:
    """A docstring, template or Makefile naming docs/<page>.md names a page that exists (pages
    move, as the analysis page did into reference/metrics.md and reference/schemas.md)."""
    named = re.compile(r"docs/[\w/.-]+\.md")
    sources = [
        *(
            p
            for top in ("analysis", "bench", "profiler", "workloads", "tests")
            for p in (REPO / top).rglob("*.py")
        ),
        *(REPO / "analysis" / "report" / "templates").iterdir(),
        REPO / "Makefile",
    ]
    missing = {
        (str(path.relative_to(REPO)), doc)
        for path in sources
        for doc in named.findall(path.read_text(encoding="utf-8"))
        if not (REPO / doc).is_file()
    }
    assert not missing, sorted(missing)
