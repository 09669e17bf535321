"""RetryPolicy: full-jitter backoff on the injected clock, the attempt budget, and a caller's deadline."""

from __future__ import annotations

import random

import pytest

from shardherd.shared.clock import ManualClock
from shardherd.shared.errors import StoreUnavailable
from shardherd.shared.retry import RetryPolicy, retry_deadline


class Flaky:
    """Fails `failures` times with a transient error, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("injected")
        return "ok"


def transient(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError)


def test_retries_until_success_sleeping_on_the_injected_clock() -> None:
    clock = ManualClock()
    policy = RetryPolicy(max_attempts=5, base_delay=0.1, max_delay=1.0, clock=clock, rng=random.Random(1))
    start = clock.monotonic()
    assert policy.call(Flaky(3), transient, "test op") == "ok"
    assert 0 < clock.monotonic() - start <= 0.1 + 0.2 + 0.4  # three sleeps, each at most its cap


def test_gives_up_after_the_budget_and_passes_other_errors_through() -> None:
    policy = RetryPolicy(max_attempts=3, clock=ManualClock(), rng=random.Random(2))
    flaky = Flaky(10)
    with pytest.raises(StoreUnavailable, match="test op failed 3 times"):
        policy.call(flaky, transient, "test op")
    assert flaky.calls == 3

    def broken() -> str:
        raise ValueError("not transient")

    with pytest.raises(ValueError):
        policy.call(broken, transient, "test op")


def test_a_callers_deadline_ends_retrying_before_it_passes() -> None:
    clock = ManualClock()
    policy = RetryPolicy(max_attempts=50, base_delay=0.5, max_delay=2.0, clock=clock, rng=random.Random(3))
    deadline = clock.monotonic() + 3.0
    flaky = Flaky(1000)
    with retry_deadline(deadline), pytest.raises(StoreUnavailable, match="deadline"):
        policy.call(flaky, transient, "heartbeat")
    assert clock.monotonic() < deadline
    assert 1 < flaky.calls < 50
    # Outside the block the full budget applies again.
    assert policy.call(Flaky(5), transient, "heartbeat") == "ok"
