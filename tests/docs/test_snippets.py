"""Every Python snippet in the docs, and every shell snippet marked so, is a file of the repository that a test runs:
the doc shows it after a `<!-- file: path -->` line, character for character."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.test_citations import ROOT, documents

FENCE = re.compile(r"(?P<marker><!-- file: (?P<path>[\w./-]+) -->\n)?```python\n(?P<body>.*?)```", re.S)
SHELL_FILE = re.compile(r"<!-- file: (?P<path>[\w./-]+) -->\n```(?:bash|sh)\n(?P<body>.*?)```", re.S)


def python_snippets() -> list[tuple[Path, str | None, str]]:
    """(document, the file it says it shows or None, the snippet) for every Python code block of the docs."""
    return [(doc, match["path"], match["body"]) for doc in documents() for match in FENCE.finditer(doc.read_text())]


def shell_files() -> list[tuple[Path, str, str]]:
    """(document, file, the snippet) for every shell code block of the docs that says which file it shows."""
    return [(doc, match["path"], match["body"]) for doc in documents()
            for match in SHELL_FILE.finditer(doc.read_text())]


def test_every_python_snippet_is_a_repository_file_shown_exactly() -> None:
    snippets = python_snippets()
    assert snippets, "docs/spark.md shows the example job"
    for doc, path, body in snippets:
        assert path is not None, f"{doc.relative_to(ROOT)}: a Python snippet without a <!-- file: ... --> line"
        assert (ROOT / path).read_text() == body, f"{doc.relative_to(ROOT)} shows {path} with differences"


def test_every_marked_shell_snippet_is_a_repository_file_shown_exactly() -> None:
    snippets = shell_files()
    assert snippets, "docs/spark.md shows examples/local_job.sh"
    for doc, path, body in snippets:
        assert (ROOT / path).read_text() == body, f"{doc.relative_to(ROOT)} shows {path} with differences"


def test_every_shown_file_is_run_by_a_test() -> None:
    this = Path(__file__).resolve()
    tests = [test.read_text() for test in (ROOT / "tests").rglob("test_*.py") if test.resolve() != this]
    for doc, path, _ in [*python_snippets(), *shell_files()]:
        assert path is not None and any(path in text or Path(path).name in text for text in tests), (doc, path)
