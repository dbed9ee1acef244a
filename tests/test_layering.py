"""The house rules (docs/architecture.md), checked by parsing every first-party import.

Imports inside functions count as much as those at the top (a lazy import that dodges a cycle is
still a cycle); imports under `if TYPE_CHECKING:` don't, since they never run. Rules:

- no cycle between first-party modules;
- analysis/ never imports torch or workloads/ (it must run on a machine without torch);
- profiler/ imports neither workloads/ nor analysis/ (it sits below both);
- profiler/runfolder/ (the run-folder contract) imports nothing first-party outside itself and
  never torch: it is the ground floor both halves stand on;
- analysis/ imports profiler/ only through profiler/runfolder/ (never the torch instruments);
- workloads/ imports analysis/ only from workloads/tools/ (tools read finished run folders);
- no module uses another's private (`_name`) names, and no class has a second name
  (`AnalysisError = InputError`);
- analysis/report/ only renders: it reads the typed entries of analysis/runs/ (and
  analysis/project/view.py) as attributes, so it makes fewer than 40 `.get(` calls (the
  dict-hub report it replaced made 349).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.source_trees import parse_file

REPO = Path(__file__).resolve().parents[1]
FIRST_PARTY = ("analysis", "bench", "profiler", "workloads")
REPORT_GETS_MAX = 40  # `.get(` calls in analysis/report/*.py (keys of render-only mappings)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, package: str) -> list[tuple[str, list[str]]]:
    """(module, names) for every executed import; relative imports resolved against `package`."""
    found: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, []) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                found.append((base, [alias.name for alias in child.names]))
            visit(child)

    visit(tree)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """First-party module -> the first-party modules it imports (`from pkg import mod` -> pkg.mod)."""
    files = {
        _module_name(p, root): p
        for top in FIRST_PARTY
        if (root / top).is_dir()
        for p in (root / top).rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for module, names in _imports(parse_file(path), package):
            if module.split(".")[0] not in FIRST_PARTY:
                continue
            subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in files]
            edges.update(subs or [module])
        graph[name] = edges - {name}
    return graph


def external_imports(root: Path, top: str) -> dict[str, set[str]]:
    """Module -> the top-level names of everything it imports (first-party or not)."""
    out: dict[str, set[str]] = {}
    for path in (root / top).rglob("*.py"):
        name = _module_name(path, root)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = parse_file(path)
        out[name] = {module.split(".")[0] for module, _ in _imports(tree, package) if module}
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, ..., a], or None (iterative DFS, three colours)."""
    state: dict[str, int] = {}
    for start in sorted(graph):
        if state.get(start):
            continue
        stack: list[tuple[str, list[str]]] = [(start, sorted(graph.get(start, ())))]
        path = [start]
        state[start] = 1
        while stack:
            node, todo = stack[-1]
            if not todo:
                state[node] = 2
                stack.pop()
                path.pop()
                continue
            nxt = todo.pop()
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if not state.get(nxt) and nxt in graph:
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, sorted(graph[nxt])))
    return None


def private_uses(root: Path) -> list[str]:
    """`file:line name` for each use of another module's private name: `from m import _x`, or
    `m._x` where `m` is a first-party module this file imports. A name with a leading underscore
    is its module's own; a second module that needs it means it is public (rename it)."""
    tops = (*FIRST_PARTY, "tests")
    modules = {
        _module_name(p, root)
        for top in tops
        if (root / top).is_dir()
        for p in (root / top).rglob("*.py")
    }
    bad: list[str] = []
    for top in tops:
        for path in sorted((root / top).rglob("*.py")) if (root / top).is_dir() else []:
            tree = ast.parse(path.read_text(), str(path))
            bound: set[str] = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    bound.update(
                        a.asname or a.name.split(".")[0]
                        for a in node.names
                        if a.name.split(".")[0] in tops
                    )
                elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in tops:
                    for a in node.names:
                        if a.name.startswith("_") and not a.name.startswith("__"):
                            bad.append(
                                f"{path.relative_to(root)}:{node.lineno} {node.module}.{a.name}"
                            )
                        elif f"{node.module}.{a.name}" in modules:
                            bound.add(a.asname or a.name)
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in bound
                    and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                ):
                    bad.append(
                        f"{path.relative_to(root)}:{node.lineno} {node.value.id}.{node.attr}"
                    )
    return bad


def class_aliases(root: Path) -> list[str]:
    """`file:line A = B` for each module-level second name of a class (`AnalysisError =
    InputError`): one class, one name."""
    bad: list[str] = []
    for top in FIRST_PARTY:
        for path in sorted((root / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
            for node in tree.body:
                if isinstance(node, ast.ImportFrom):
                    classes.update(
                        a.asname or a.name
                        for a in node.names
                        if a.name[:1].isupper() and not a.name.isupper()
                    )
            for node in tree.body:
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in classes
                    and all(isinstance(t, ast.Name) for t in node.targets)
                ):
                    bad.append(
                        f"{path.relative_to(root)}:{node.lineno} {node.targets[0].id} = {node.value.id}"
                    )  # type: ignore[attr-defined]
    return bad


def test_no_first_party_import_cycle():
    cycle = find_cycle(import_graph(REPO))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _violations(graph: dict[str, set[str]], source: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{mod} imports {dep}"
        for mod, deps in graph.items()
        if mod == source or mod.startswith(source + ".")
        for dep in deps
        if dep.split(".")[0] in forbidden
    )


def test_analysis_imports_neither_torch_nor_workloads():
    bad = [
        f"{mod} imports {dep}"
        for mod, deps in external_imports(REPO, "analysis").items()
        for dep in sorted(deps & {"torch", "torchvision", "workloads"})
    ]
    assert not bad, bad


def test_profiler_sits_below_workloads_and_analysis():
    assert not _violations(import_graph(REPO), "profiler", ("workloads", "analysis"))


CONTRACT = "profiler.runfolder"


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def contract_violations(root: Path) -> list[str]:
    """Imports that break the contract rules (module docstring), as `mod imports dep` lines."""
    graph = import_graph(root)
    bad = [
        f"{mod} imports {dep}"
        for mod, deps in graph.items()
        for dep in deps
        if (_in(mod, CONTRACT) and not _in(dep, CONTRACT))
        or (_in(mod, "analysis") and _in(dep, "profiler") and not _in(dep, CONTRACT))
    ]
    bad += [
        f"{mod} imports {dep}"
        for mod, deps in external_imports(root, "profiler").items()
        if _in(mod, CONTRACT)
        for dep in deps & {"torch", "torchvision"}
    ]
    return sorted(bad)


def test_the_contract_is_the_ground_floor_and_analysis_reads_only_it():
    bad = contract_violations(REPO)
    assert not bad, bad


def test_the_report_reads_typed_entries_not_keys():
    """Counted as `grep -o "\\.get(" analysis/report/*.py | wc -l` counts them (comments and
    strings too, so a `.get(` cannot hide in one)."""
    sources = sorted((REPO / "analysis" / "report").glob("*.py"))
    counts = {p.name: n for p in sources if (n := len(re.findall(r"\.get\(", p.read_text())))}
    assert sum(counts.values()) < REPORT_GETS_MAX, counts


def test_workloads_import_analysis_only_from_tools():
    bad = [
        v
        for v in _violations(import_graph(REPO), "workloads", ("analysis",))
        if not v.startswith("workloads.tools")
    ]
    assert not bad, bad


# The checker itself, on packages built here, so the rules above can fail.
def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_checker_finds_a_cycle_hidden_in_a_function(tmp_path):
    root = _write(
        tmp_path,
        {
            "analysis/__init__.py": "",
            "analysis/a.py": "from analysis import b\n",
            "analysis/b.py": "def f():\n    from analysis.a import x\n",
            "analysis/c.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from analysis.a import y\n",
        },
    )
    graph = import_graph(root)
    assert graph["analysis.c"] == set()  # type-checking imports never run
    assert find_cycle(graph) in (
        ["analysis.a", "analysis.b", "analysis.a"],
        ["analysis.b", "analysis.a", "analysis.b"],
    )


@pytest.mark.parametrize(
    ("source", "text", "rule"),
    [
        ("analysis/x.py", "import torch\n", "torch"),
        ("analysis/x.py", "def f():\n    from workloads.plan import plan\n", "workloads"),
        ("profiler/x.py", "from analysis import errors\n", "analysis"),
    ],
)
def test_checker_sees_forbidden_imports(tmp_path, source, text, rule):
    root = _write(
        tmp_path,
        {
            "analysis/__init__.py": "",
            "analysis/errors.py": "",
            "profiler/__init__.py": "",
            "workloads/__init__.py": "",
            "workloads/plan.py": "",
            source: text,
        },
    )
    top = source.split("/")[0]
    found = external_imports(root, top)[source.removesuffix(".py").replace("/", ".")]
    assert rule in found


def test_checker_sees_contract_breaks(tmp_path):
    root = _write(
        tmp_path,
        {
            "analysis/__init__.py": "",
            "analysis/a.py": "from profiler.session import ProfilerSession\n",
            "analysis/b.py": "from profiler.runfolder.layout import RUN_JSON\n",
            "profiler/__init__.py": "",
            "profiler/session.py": "import torch\n",
            "profiler/runfolder/__init__.py": "",
            "profiler/runfolder/layout.py": "def f():\n    from profiler import session\n",
            "profiler/runfolder/schema.py": "import torch\n",
        },
    )
    assert contract_violations(root) == [
        "analysis.a imports profiler.session",
        "profiler.runfolder.layout imports profiler.session",
        "profiler.runfolder.schema imports torch",
    ]


def test_no_module_uses_another_modules_private_names():
    bad = private_uses(REPO)
    assert not bad, f"a name another module uses is public: drop its underscore: {bad}"


def test_one_class_has_one_name():
    bad = class_aliases(REPO)
    assert not bad, bad


def test_checkers_see_private_uses_and_class_aliases(tmp_path):
    (tmp_path / "analysis").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "analysis" / "a.py").write_text("def _x():\n    pass\n\n\nclass Kls:\n    pass\n")
    (tmp_path / "analysis" / "b.py").write_text(
        "from analysis.a import _x\nfrom analysis import a\n\nKK = a.Kls\na._x()\n"
    )
    (tmp_path / "analysis" / "c.py").write_text("from analysis.a import Kls\n\nAlias = Kls\n")
    assert private_uses(tmp_path) == ["analysis/b.py:1 analysis.a._x", "analysis/b.py:5 a._x"]
    assert class_aliases(tmp_path) == ["analysis/c.py:3 Alias = Kls"]
