"""No function of the product or its benches is above cyclomatic complexity 15 as radon counts it (boolean operators
included), so a newcomer can read and change each one (issue 31 asked it of coordinator/deciders/, decision 0020;
since session 25 it holds for agent/, bench/, coordinator/, examples/, services/ and shared/). Tests are left out:
a test is a list of assertions, each `and` of which radon counts."""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("agent", "bench", "coordinator", "examples", "services", "shared")
LIMIT = 15


def test_no_function_is_above_the_complexity_limit() -> None:
    modules = sorted(path for folder in CHECKED for path in (ROOT / folder).rglob("*.py"))
    over = [f"{path.relative_to(ROOT)}:{block.lineno} {block.fullname} {block.complexity}"
            for path in modules for block in cc_visit(path.read_text()) if block.complexity > LIMIT]
    assert len(modules) > 100 and not over, over
