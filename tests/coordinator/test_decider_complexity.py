"""No function in coordinator/deciders/ is above cyclomatic complexity 15 as radon counts it (boolean operators
included), so a newcomer can read and change each one (issue 31; decision 0020)."""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_visit

DECIDERS = Path(__file__).resolve().parents[2] / "coordinator" / "deciders"
LIMIT = 15


def test_no_decider_function_is_above_the_complexity_limit() -> None:
    modules = sorted(DECIDERS.glob("*.py"))
    over = [f"{path.name}:{block.lineno} {block.fullname} {block.complexity}"
            for path in modules for block in cc_visit(path.read_text()) if block.complexity > LIMIT]
    assert modules and not over, over
