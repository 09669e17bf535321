"""Injectable time: every component takes a Clock so protocol tests run on virtual time, deterministically."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Wall time for records, monotonic time for liveness judgements, and a sleep that honours the same clock."""

    def time(self) -> float:
        """Seconds since the epoch (wall clock); only ever written into records, never compared across hosts."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps; used for every local timeout and liveness observation."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the caller for `seconds` of this clock's time."""
        ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Block for `seconds` of this clock's time or until `event` is set, whichever comes first; True if it is."""
        ...


class SystemClock:
    """The real clock of this process."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""
        return time.time()

    def monotonic(self) -> float:
        """Monotonic seconds."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Sleep for real."""
        if seconds > 0:
            time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait on the event for real: woken at once when it is set, not by polling it."""
        return event.wait(max(0.0, seconds))


class ManualClock:
    """A virtual clock for tests and simulations: time moves only when `advance` (or `sleep`) is called."""

    def __init__(self, start_wall: float = 1_700_000_000.0, start_monotonic: float = 1_000.0) -> None:
        self._wall = start_wall
        self._mono = start_monotonic
        self._lock = threading.Lock()

    def time(self) -> float:
        """Virtual wall time."""
        with self._lock:
            return self._wall

    def monotonic(self) -> float:
        """Virtual monotonic time."""
        with self._lock:
            return self._mono

    def sleep(self, seconds: float) -> None:
        """Advance virtual time instead of blocking."""
        self.advance(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """True at once if the event is set; else `sleep(seconds)` (virtual time passes) and whether it is set now."""
        if event.is_set():
            return True
        self.sleep(max(0.0, seconds))
        return event.is_set()

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by `seconds` (never backwards)."""
        if seconds < 0:
            raise ValueError("a clock never moves backwards")
        with self._lock:
            self._wall += seconds
            self._mono += seconds

    def skew_wall(self, seconds: float) -> None:
        """Shift only the wall clock (either way), as a host with a wrong clock would; monotonic time is unaffected."""
        with self._lock:
            self._wall += seconds
