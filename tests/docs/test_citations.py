"""The docs, the README and code comments cite only files of the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP_FOLDERS = ("agent", "bench", "coordinator", "deploy", "docs", "examples", "helm", "scripts", "services", "shared",
               "tests")
# A path in backquotes that starts at one of the repository's top folders, e.g. `docs/spark.md` or `tests/spark/`.
REPO_PATH = re.compile(r"`((?:" + "|".join(TOP_FOLDERS) + r")/[\w./-]*)`")
# Citations of material outside the repository: a parent folder, the engineers' machine, numbered reference sections.
OUTSIDE = re.compile(r"\.\./shared|/work/|shared/spec|\breference (?:section )?\d+\.?\d*|\(\d\.\d+ #\d+")


def documents() -> list[Path]:
    """Every Markdown file of the repository outside generated and vendored folders."""
    skip = {".venv", "node_modules", ".git", "shardherd.egg-info"}
    return [p for p in ROOT.rglob("*.md") if not skip.intersection(p.relative_to(ROOT).parts)]


def sources() -> list[Path]:
    """Every Python file of the packages, tests and benches."""
    return [p for folder in TOP_FOLDERS for p in (ROOT / folder).rglob("*.py") if "node_modules" not in p.parts]


def test_cited_repository_paths_exist() -> None:
    missing = [
        f"{doc.relative_to(ROOT)}: {path}"
        for doc in documents()
        for path in REPO_PATH.findall(doc.read_text())
        if "*" not in path and not (ROOT / path.rstrip("/")).exists()
    ]
    assert documents() and not missing, missing


def test_nothing_outside_the_repository_is_cited() -> None:
    this_file = Path(__file__).resolve()
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in [*documents(), *sources()]
        if path.resolve() != this_file
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert not found, found
