"""The four code folders install under one `shardherd` namespace, and `shardherd` is a small public surface."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest

import shardherd

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shared", "coordinator", "agent", "services")
SOURCE_FOLDERS = (*PACKAGES, "tests", "bench", "examples")


def test_each_package_folder_is_linked_under_shardherd() -> None:
    for package in PACKAGES:
        link = ROOT / "shardherd" / package
        assert link.is_symlink() and link.resolve() == (ROOT / package).resolve(), package


def _top_level_imports(path: Path) -> list[str]:
    """Imports of a package folder by its bare name (`import shared`, `from agent.x import y`)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        found.extend(f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names
                     if name.split(".")[0] in PACKAGES)
    return found


def test_nothing_imports_a_package_by_its_bare_name() -> None:
    # Under a bare name a module would load a second time, beside its shardherd.* copy (two Settings classes).
    sources = [path for folder in SOURCE_FOLDERS for path in (ROOT / folder).rglob("*.py")
               if "node_modules" not in path.parts]
    assert len(sources) > 100
    found = [hit for path in sources for hit in _top_level_imports(path)]
    assert not found, found


@pytest.mark.parametrize("name", shardherd.__all__)
def test_each_public_name_is_its_home_module_s_object(name: str) -> None:
    home = shardherd._HOMES[name]
    assert home.startswith("shardherd.")
    assert getattr(shardherd, name) is getattr(import_module(home), name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = shardherd.Nope


def test_importing_shardherd_loads_neither_pyspark_nor_boto3() -> None:
    script = "import sys, shardherd; print(sorted({'pyspark', 'boto3', 'fastapi'} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd="/")
    assert loaded.stdout.strip() == "[]"


def test_python_dash_m_shardherd_runs_the_command_line() -> None:
    shown = subprocess.run([sys.executable, "-m", "shardherd", "--help"], capture_output=True, text=True, timeout=60,
                           cwd="/")
    assert shown.returncode == 0, shown.stderr
    assert "coordinator" in shown.stdout and "agent" in shown.stdout


# Layering: the leader-agent protocol lives in shared/; an agent runs without the coordinator's code and shared/
# serves every side. Package -> the packages it must not import (lazily inside a function included).
FORBIDDEN = {"agent": ("coordinator",), "shared": ("coordinator", "agent", "services")}


def _imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, shardherd package) for every `shardherd.<package>` module the file imports, at any depth."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module] if node.module != "shardherd" else [f"shardherd.{a.name}" for a in node.names]
        else:
            continue
        found.extend((node.lineno, module.split(".")[1]) for module in modules
                     if module.startswith("shardherd.") and len(module.split(".")) > 1)
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_agent_and_shared_import_nothing_from_the_layers_above(package: str) -> None:
    sources = sorted((ROOT / package).rglob("*.py"))
    assert len(sources) > 10
    crossing = [f"{path.relative_to(ROOT)}:{line}: shardherd.{imported}" for path in sources
                for line, imported in _imported_packages(path) if imported in FORBIDDEN[package]]
    assert not crossing, crossing
