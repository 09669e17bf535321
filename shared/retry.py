"""Jittered, capped exponential backoff for transient store errors (throttling, 5xx, dropped connections)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from shardherd.shared.clock import Clock, SystemClock
from shardherd.shared.errors import StoreUnavailable

T = TypeVar("T")

_local = threading.local()


@contextmanager
def retry_deadline(monotonic_deadline: float) -> Iterator[None]:
    """Within this block (this thread only), retries give up rather than sleep past `monotonic_deadline`.

    For callers with a hard deadline of their own, such as an agent that must fence itself on time: a store call
    that would still be retrying at the deadline fails with StoreUnavailable instead.
    """
    previous = getattr(_local, "deadline", None)
    _local.deadline = monotonic_deadline if previous is None else min(previous, monotonic_deadline)
    try:
        yield
    finally:
        _local.deadline = previous


@dataclass
class RetryPolicy:
    """Full-jitter exponential backoff: attempt n sleeps uniform(0, min(cap, base * 2**n)); gives up after max_attempts.

    `is_transient` decides which exceptions are retried; anything else propagates at once.
    """

    max_attempts: int = 8
    base_delay: float = 0.05
    max_delay: float = 2.0
    clock: Clock = field(default_factory=SystemClock)
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int) -> float:
        """The sleep before retry number `attempt` (0-based)."""
        return self.rng.uniform(0.0, min(self.max_delay, self.base_delay * (2**attempt)))

    def call(self, operation: Callable[[], T], is_transient: Callable[[BaseException], bool], what: str) -> T:
        """Run `operation`, retrying transient failures; raise StoreUnavailable naming `what` when out of attempts."""
        for attempt in range(self.max_attempts):
            try:
                return operation()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if attempt == self.max_attempts - 1:
                    raise StoreUnavailable(f"{what} failed {self.max_attempts} times; last error: {exc}") from exc
                pause = self.delay(attempt)
                deadline: float | None = getattr(_local, "deadline", None)
                if deadline is not None and self.clock.monotonic() + pause >= deadline:
                    raise StoreUnavailable(f"{what} failed; the caller's deadline comes first: {exc}") from exc
                self.clock.sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover
