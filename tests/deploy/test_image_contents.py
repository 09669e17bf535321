"""Which repository files each image gets: the build context (.dockerignore applied as Docker does) under each
Dockerfile's COPY sources. The development tooling stays out of both images, every module the images import is
in them, and the agent image carries the example Spark job where the Spark examples run it."""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path, PurePosixPath

import dockerfile  # type: ignore[import-not-found]  # a C extension without stubs
import pytest

from shardherd.services.cli import DEV_COMMANDS, build_parser
from tests.deploy.rendering import EXAMPLES, REPO

IMAGES = ["Dockerfile.coordinator", "Dockerfile.agent"]
PACKAGE = "shardherd"  # the folder `shardherd/` holds the public surface and links to the four package folders
PACKAGES = ("shared", "coordinator", "agent", "services")
# The development tooling: the local stack, the emulator launchers, `shardherd demo` and `shardherd up`.
DEV_TOOLING = ("services/local_stack/", "services/emulators/", "services/demo.py", "services/up_cli.py")
EXAMPLE_JOB = ("examples/spark_job.py", "/opt/app/spark_job.py")


def _pattern(rule: str) -> re.Pattern[str]:
    """A .dockerignore rule as a regex over slash-separated paths (Go's filepath.Match, plus `**`)."""
    out = ""
    index = 0
    while index < len(rule):
        if rule.startswith("**/", index):
            out, index = out + "(?:.*/)?", index + 3
        elif rule.startswith("**", index):
            out, index = out + ".*", index + 2
        elif rule[index] == "*":
            out, index = out + "[^/]*", index + 1
        elif rule[index] == "?":
            out, index = out + "[^/]", index + 1
        elif rule[index] == "[":
            end = rule.index("]", index)
            out, index = out + rule[index:end + 1], end + 1
        else:
            out, index = out + re.escape(rule[index]), index + 1
    return re.compile(out)


@cache
def context_files() -> frozenset[str]:
    """The files of the repository that reach the builder: tracked files filtered by .dockerignore, in order, where
    a rule matching a folder covers everything under it and a `!` rule takes a path back."""
    rules = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    compiled = [(rule.startswith("!"), _pattern(rule.lstrip("!").strip("/"))) for rule in rules]
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.split()
    kept = set()
    for path in tracked:
        parts = PurePosixPath(path).parts
        prefixes = ["/".join(parts[:depth]) for depth in range(1, len(parts) + 1)]
        excluded = False
        for negated, pattern in compiled:
            if any(pattern.fullmatch(prefix) for prefix in prefixes):
                excluded = not negated
        if not excluded and ((REPO / path).is_file() or (REPO / path).is_symlink()):
            kept.add(path)
    return frozenset(kept)


def copies(name: str) -> list[tuple[str, str]]:
    """(context source, destination) of every COPY from the build context (not from another stage)."""
    found: list[tuple[str, str]] = []
    for command in dockerfile.parse_file(str(REPO / name)):
        if command.cmd == "COPY" and not any(flag.startswith("--from=") for flag in command.flags):
            *sources, destination = command.value
            found.extend((source.strip("./") or ".", destination) for source in sources)
    return found


def image_files(name: str) -> set[str]:
    """The context files that the Dockerfile's COPY instructions take."""
    sources = [source for source, _ in copies(name)]
    return {path for path in context_files()
            if any(path == source or path.startswith(source.rstrip("/") + "/") for source in sources)}


def _imports(path: Path) -> set[str]:
    """Modules of the repository's packages that `path` imports at run time, lazy imports included.

    Skipped: imports under `if TYPE_CHECKING:`, and optional ones: in a function that first asks
    `importlib.util.find_spec` whether the module is installed.
    """
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return
        if isinstance(node, ast.FunctionDef) and "find_spec" in ast.unparse(node):
            return
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {name for name in names if name.split(".")[:2] in ([PACKAGE, package] for package in PACKAGES)}


def _module_file(module: str) -> str | None:
    """The repository file of `module`, or None when the name is not a module (an attribute of one)."""
    base = module.removeprefix(f"{PACKAGE}.").replace(".", "/")
    for candidate in (f"{base}.py", f"{base}/__init__.py"):
        if (REPO / candidate).is_file():
            return candidate
    return None


@pytest.mark.parametrize("name", IMAGES)
def test_the_development_tooling_is_not_in_the_images(name: str) -> None:
    files = image_files(name)
    assert {"services/cli.py", "services/coordinator_service.py", "services/agent_service.py",
            "coordinator/leader_loop.py", "agent/lease_keeper.py", "shared/config.py"} <= files
    leaked = sorted(path for path in files for tool in DEV_TOOLING if path == tool or path.startswith(tool))
    assert not leaked, leaked
    assert not [path for path in files if path.startswith(("tests/", "bench/", "docs/", "helm/"))]


@pytest.mark.parametrize("name", IMAGES)
def test_every_module_the_images_import_is_in_them(name: str) -> None:
    files = image_files(name)
    missing = sorted(
        f"{path} imports {module}"
        for path in files if path.endswith(".py")
        for module in _imports(REPO / path)
        if (file := _module_file(module)) is not None and file not in files
    )
    assert not missing, missing


def test_the_agent_image_ships_the_example_job_the_spark_examples_run() -> None:
    source, destination = EXAMPLE_JOB
    assert (source, destination) in copies("Dockerfile.agent")
    assert source in context_files()
    assert source not in image_files("Dockerfile.coordinator")
    for example in ("spark-submit.sh", "spark-application.yaml"):
        assert f"local://{destination}" in (EXAMPLES / example).read_text(), example


def build_context(name: str, into: Path) -> None:
    """Copy the files (and the package links) the Dockerfile's COPY instructions take to `into`."""
    for path in image_files(name):
        source, target = REPO / path, into / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(source.readlink())
        else:
            target.write_bytes(source.read_bytes())


def test_the_cli_of_the_coordinator_image_runs_without_the_development_tooling(tmp_path: Path) -> None:
    build_context("Dockerfile.coordinator", tmp_path)
    # The image's files first on the path, and without the finder of this checkout's editable install.
    script = ("import sys; sys.path.insert(0, sys.argv[1]); "
              "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '')]; "
              "from shardherd.services.cli import main; main(['--help'])")
    shown = subprocess.run([sys.executable, "-I", "-c", script, str(tmp_path)], capture_output=True, text=True,
                           timeout=60, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    commands = re.search(r"\{([a-z,-]+)\}", shown.stdout)
    assert commands is not None, shown.stdout
    assert set(commands.group(1).split(",")) == _commands() - _commands(DEV_COMMANDS)  # every one but the dev tools
    assert {"agent", "coordinator", "multilang", "drain"} <= set(commands.group(1).split(","))


def _commands(modules: Sequence[str] | None = None) -> set[str]:
    """The subcommands this checkout's CLI registers (only those of `modules`, when given)."""
    if modules is None:
        parser = build_parser()
    else:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        for name in modules:
            importlib.import_module(name).register(sub)
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(action.choices)


def test_the_package_the_coordinator_image_installs_holds_the_dashboard(tmp_path: Path) -> None:
    build_context("Dockerfile.coordinator", tmp_path / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(tmp_path / "src")], check=True, capture_output=True, timeout=180)
    (wheel,) = (tmp_path / "dist").glob("shardherd-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    dashboard = {f"shardherd/services/api/dashboard/{asset.name}"
                 for asset in (REPO / "services" / "api" / "dashboard").iterdir()}
    assert dashboard and dashboard <= names, sorted(dashboard - names)
    assert {"shardherd/__init__.py", "shardherd/services/cli.py", "shardherd/shared/sql/migrations/env.py"} <= names
    assert not [name for name in names if name.startswith("shardherd/services/local_stack/")]
