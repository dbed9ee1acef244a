"""The package (pyproject.toml): metadata, dependencies in step with the pins, the packages and
files a wheel holds, and the `dpscope` script it installs."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from setuptools import find_packages  # installed with tensorboard (a pinned dependency)

from tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
PACKAGES = ("analysis", "profiler", "workloads")


def _pins(path: Path) -> dict[str, Version]:
    """{normalised name: pinned version} of a requirements file (`name==version` lines)."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{path.name}: {line} is not an exact pin"
            pins[req.name.lower()] = Version(spec.version)
    return pins


def _ranges(requirements: list[str]) -> dict[str, Requirement]:
    return {(r := Requirement(s)).name.lower(): r for s in requirements}


def test_metadata() -> None:
    assert PROJECT["name"] == "dpscope" and Version(PROJECT["version"])
    assert PROJECT["requires-python"] == ">=3.11"
    assert PYPROJECT["build-system"]["build-backend"] == "setuptools.build_meta"
    module, _, func = PROJECT["scripts"]["dpscope"].partition(":")
    assert callable(getattr(importlib.import_module(module), func))


@pytest.mark.parametrize(
    ("requirements", "groups"),
    [
        ("requirements.txt", ("dependencies", "dev", "dask")),
        ("requirements-bench.txt", ("bench",)),
    ],
)
def test_every_pin_is_declared_and_within_its_range(requirements: str, groups) -> None:
    """make setup installs the pins, pip install the ranges: each pin must satisfy its range."""
    declared: dict[str, Requirement] = {}
    for group in groups:
        extra = PROJECT["optional-dependencies"].get(group)
        declared |= _ranges(PROJECT["dependencies"] if group == "dependencies" else extra)
    pins = _pins(REPO / requirements)
    assert sorted(pins) == sorted(declared), (requirements, groups)
    for name, version in pins.items():
        assert declared[name].specifier.contains(version), (name, version, declared[name])


def test_the_packages_are_every_first_party_package_and_nothing_else() -> None:
    found = set(find_packages(str(REPO), **PYPROJECT["tool"]["setuptools"]["packages"]["find"]))
    on_disk = {
        ".".join(init.parent.relative_to(REPO).parts)
        for top in PACKAGES
        for init in (REPO / top).rglob("__init__.py")
    }
    assert found == on_disk
    assert not any(p.split(".")[0] in ("tests", "bench", "runs", "reports") for p in found)


@pytest.mark.integration
def test_the_wheel_holds_the_packages_templates_and_the_script(tmp_path: Path) -> None:
    """A real build with the configured backend (setuptools, offline), from a copy of the
    sources so that no build output lands in the clone."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", *PACKAGES):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(REPO / name, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    proc = subprocess.run(
        [*cmd, "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "dist").glob("dpscope-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    templates = {p.name for p in (REPO / "analysis" / "report" / "templates").iterdir()}
    assert {n.rsplit("/", 1)[-1] for n in names if "/report/templates/" in n} == templates
    assert "workloads/tools/cli.py" in names and "profiler/runfolder/errors.py" in names
    assert not [n for n in names if n.startswith(("tests/", "bench/", "runs/", "reports/"))]
    (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "dpscope = workloads.tools.cli:main" in text
