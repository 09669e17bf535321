"""The one polling helper of the tests: wait for a condition with a deadline, fail naming what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], bool], timeout: float, what: str | Callable[[], str],
             period: float = 0.1) -> float:
    """Poll `condition()` every `period` s; the seconds it took, or AssertionError naming `what` after `timeout`.

    `what` may be a function: it is called at the timeout, so the failure can show the state the wait ended in.
    """
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if condition():
            return time.monotonic() - start
        time.sleep(period)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")
