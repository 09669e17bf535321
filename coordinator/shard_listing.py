"""Shard listing apart from assignment: the leader loop asks for a listing and takes it when it is done.

Invariants:
1. At most one listing is in flight; `request` while one runs does nothing.
2. A listing runs under a total deadline (`deadline` seconds: retries give up before it; each call's own connect and
   read timeouts are shorter, see `listing_client_timeouts`), so a blackholed Kinesis ends an attempt in seconds.
3. The outcome (listings or the error) carries the monotonic time the attempt ENDED: the leader's backoff after a
   failure counts from there, so a long attempt is not due again at once.
4. With the thread started (`step` run by a supervised loop) the leader loop never waits for Kinesis: failing over
   expired leases goes on at the assignment interval whatever ListShards does. Without a thread (tests, tools),
   `request` lists inline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from shardherd.coordinator.stream_sync import StreamListings
from shardherd.shared.clock import Clock
from shardherd.shared.retry import retry_deadline
from shardherd.shared.shards import Shard

Found = list[Shard] | StreamListings
REQUEST_WAIT_SECONDS = 0.25  # how long one step waits for a request before returning (so the loop can stop)


@dataclass(frozen=True, slots=True)
class Listed:
    """One finished listing attempt: what it found, or why it failed, and when it ended (monotonic seconds)."""

    ended: float
    found: Found | None = None
    error: Exception | None = None


def listing_client_timeouts(deadline: float) -> tuple[float, float]:
    """Connect and read timeouts (seconds) for the Kinesis client of shard sync: a quarter and half the deadline."""
    return max(0.5, min(5.0, deadline / 4)), max(1.0, min(30.0, deadline / 2))


class ShardListing:
    """Runs the shard source when asked, on its own thread once `threaded()` (see the module invariants)."""

    def __init__(self, source: Callable[[], Found], clock: Clock, deadline: float) -> None:
        self._source = source
        self._clock = clock
        self._deadline = deadline
        self._requested = threading.Event()
        self._guard = threading.Lock()
        self._running = False
        self._threaded = False
        self._done: Listed | None = None

    def threaded(self) -> None:
        """From now on listings run in `step` (a supervised thread), no longer inline in `request`."""
        self._threaded = True

    def request(self) -> None:
        """Ask for a listing (no-op while one is in flight or waiting to be taken)."""
        with self._guard:
            if self._running or self._done is not None:
                return
            self._running = True
        if self._threaded:
            self._requested.set()
        else:
            self._list()

    def take(self) -> Listed | None:
        """The finished attempt not yet taken, if any."""
        with self._guard:
            done, self._done = self._done, None
            return done

    def step(self) -> None:
        """The listing thread's step: wait briefly for a request, then list."""
        if self._requested.wait(REQUEST_WAIT_SECONDS):
            self._requested.clear()
            self._list()

    def _list(self) -> None:
        try:
            with retry_deadline(self._clock.monotonic() + self._deadline):
                listed = Listed(0.0, found=self._source())
        except Exception as exc:  # handed to the leader loop, which counts and reports it
            listed = Listed(0.0, error=exc)
        with self._guard:
            self._done = Listed(self._clock.monotonic(), listed.found, listed.error)
            self._running = False
