"""Jittered, capped exponential backoff for transient store errors (throttling, 5xx, dropped connections)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from shared.clock import Clock, SystemClock
from shared.errors import StoreUnavailable

T = TypeVar("T")


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
                self.clock.sleep(self.delay(attempt))
        raise AssertionError("unreachable")  # pragma: no cover
