"""Held leases whose reading makes no progress: health turns red, then the lease is given back (issue 30).

Invariants:
1. Every lease the keeper holds in PROCESSING state is watched from the moment it is first seen; its reader (a plain
   agent's shard worker thread, a Spark driver's probes and its query) reports progress with `progressed(key)`: a
   read that answered, a batch delivered, a backoff step of a retry policy it is following, and for a Spark shard
   whose records wait for the next batch the query's own progress (agent/spark/query_watch.py, reported with the
   time it happened). Nothing else counts.
2. A lease is *stalled* once its reader made no progress for `red_after` (3 heartbeat intervals): /healthz is red
   while one is (`problem`), and /metrics lists it.
3. A stalled lease is given back (released, reported as refused so the leader gives it to another worker) once its
   reader cannot be restarted (it says it is not running: its thread is dead or waiting for a restart), or once it
   made no progress for `give_up_after` (red_after + 3 failover times: a call that hangs, reads that fail for good;
   generous, since a slow first read on a loaded host must not cost a lease).
   No process holds a lease for work it is not doing; one given back is counted (`given_up`).
4. Pure bookkeeping on an injected clock; the caller runs `check()` on a supervised loop and owns the give-back.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from shardherd.shared.clock import Clock
from shardherd.shared.config import Settings

log = logging.getLogger(__name__)

RED_INTERVALS = 3  # heartbeat intervals without progress before a held lease turns health red
# Failover times more before a lease whose reader still runs is given back. One was too few: on a host at load 40 a
# first GetRecords from TRIM_HORIZON took longer, and the receiver gave every lease it got back (the CI cell churned).
GIVE_UP_FAILOVERS = 3


class Verdict(enum.Enum):
    """What a held lease's progress calls for."""

    OK = "ok"
    STALLED = "stalled"  # health red
    GIVE_UP = "give_up"  # given back


@dataclass(frozen=True, slots=True)
class StallBounds:
    """Seconds without progress before a held lease is stalled (`red_after`) and given back (`give_up_after`)."""

    red_after: float
    give_up_after: float

    @classmethod
    def from_settings(cls, settings: Settings) -> StallBounds:
        """3 heartbeat intervals to red; GIVE_UP_FAILOVERS failover times more to give back a reader that still runs."""
        red = RED_INTERVALS * settings.effective_heartbeat_interval_millis / 1000
        return cls(red, red + GIVE_UP_FAILOVERS * settings.failover_time_millis / 1000)


def verdict(since_progress: float, running: bool, bounds: StallBounds) -> Verdict:
    """The rule of invariants 2 and 3 for one lease."""
    if since_progress <= bounds.red_after:
        return Verdict.OK
    if not running or since_progress > bounds.give_up_after:
        return Verdict.GIVE_UP
    return Verdict.STALLED


@dataclass(frozen=True, slots=True)
class Stalled:
    """A held lease past `red_after`, as health and /metrics show it."""

    lease_key: str
    seconds: float
    running: bool


class StallWatch:
    """Per held lease, when its reader last made progress; `check` gives back those past their bound."""

    def __init__(self, clock: Clock, bounds: StallBounds, held: Callable[[], Iterable[str]],
                 give_back: Callable[[str, str], None], running: Callable[[str], bool] | None = None) -> None:
        self._clock = clock
        self.bounds = bounds
        self._held = held
        self._give_back = give_back
        self._running = running or (lambda key: True)
        self._last: dict[str, float] = {}
        self._guard = threading.Lock()
        self.given_up = 0

    def progressed(self, lease_key: str, at: float | None = None) -> None:
        """The lease's reader made progress now, or at monotonic time `at` (invariant 1); a clock never goes back."""
        when = self._clock.monotonic() if at is None else at
        with self._guard:
            self._last[lease_key] = max(when, self._last.get(lease_key, when))

    def stalled(self) -> list[Stalled]:
        """The held leases past `red_after`, by key."""
        now = self._clock.monotonic()
        held = set(self._held())
        with self._guard:
            self._last = {key: self._last.get(key, now) for key in held}  # a lease first seen starts its clock
            ages = sorted((key, now - last) for key, last in self._last.items())
        return [Stalled(key, age, self._running(key)) for key, age in ages if age > self.bounds.red_after]

    def check(self) -> None:
        """Give back every held lease whose verdict is GIVE_UP (one log line each)."""
        for state in self.stalled():
            if verdict(state.seconds, state.running, self.bounds) is not Verdict.GIVE_UP:
                continue
            why = (f"its reader made no progress for {state.seconds:.1f} s and "
                   + ("is not running (dead or waiting for a restart)" if not state.running else "still has none"))
            log.error("lease %s: %s; giving it back", state.lease_key, why)
            with self._guard:
                self._last.pop(state.lease_key, None)
            self._give_back(state.lease_key, why)
            self.given_up += 1  # after the give-back's store writes: a reader of the counter sees the lease free

    def problem(self) -> str | None:
        """Why health is red for leases (None while every held lease progresses)."""
        stalled = self.stalled()
        if not stalled:
            return None
        return "; ".join(f"lease {state.lease_key} made no progress for {state.seconds:.1f} s (bound "
                         f"{self.bounds.red_after:.1f} s{'' if state.running else ', reader not running'})"
                         for state in stalled)
