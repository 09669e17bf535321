"""shared/clock.py's `wait`: on the system clock an event ends it at once; on the manual clock virtual time passes."""

from __future__ import annotations

import threading
import time

from shardherd.shared.clock import ManualClock, SystemClock


def test_the_system_clock_waits_until_the_event_is_set_not_for_the_whole_time() -> None:
    event = threading.Event()
    timer = threading.Timer(0.1, event.set)
    started = time.monotonic()
    timer.start()
    assert SystemClock().wait(event, 30.0)
    assert time.monotonic() - started < 5.0


def test_the_system_clock_waits_the_whole_time_for_an_event_never_set() -> None:
    started = time.monotonic()
    assert not SystemClock().wait(threading.Event(), 0.2)
    assert time.monotonic() - started >= 0.2


def test_the_manual_clock_passes_the_time_unless_the_event_is_set() -> None:
    clock, event = ManualClock(), threading.Event()
    before = clock.monotonic()
    assert not clock.wait(event, 2.5)
    assert clock.monotonic() == before + 2.5
    event.set()
    assert clock.wait(event, 2.5)
    assert clock.monotonic() == before + 2.5  # a set event: no time passes
