"""Per-lease throughput in KiB/s from the bytes actually handed to the consumer (KCL's LeaseStatsRecorder, reference 6).

Each delivery is recorded with the clock's monotonic time. `compute` sums the bytes of the last window (the renew or
heartbeat interval), turns them into KiB/s and smooths them with an EMA (alpha 0.5, first value as is). Differences
from KCL, on purpose:

* Seeding from a stored `throughputKBps` (when a lease is acquired) makes the stored value the EMA's previous value,
  so the value the new owner writes carries on from the old owner's (KCL divides the seed by the window in seconds,
  writing about a third of it first with default timings).
* Once an idle lease's value rounds to 0.0 its EMA is exactly 0.0, not an endless run of ever smaller denormals.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field

from agent.metrics import InvalidMetricInput
from shared.clock import Clock
from shared.rounding import round6

DEFAULT_ALPHA = 0.5
_BYTES_PER_KIB = 1024.0


@dataclass(slots=True)
class _LeaseStats:
    deliveries: deque[tuple[float, int]] = field(default_factory=deque)
    ema: float | None = None


class ThroughputRecorder:
    """Bytes delivered per lease over a sliding window, reported as a smoothed KiB/s; thread-safe."""

    def __init__(self, clock: Clock, window_seconds: float, alpha: float = DEFAULT_ALPHA) -> None:
        if not window_seconds > 0 or not 0 < alpha <= 1:
            raise InvalidMetricInput(f"window_seconds must be > 0 and alpha in (0, 1]: {window_seconds}, {alpha}")
        self._clock = clock
        self._window = window_seconds
        self._alpha = alpha
        self._leases: dict[str, _LeaseStats] = {}
        self._lock = threading.Lock()

    def record(self, lease_key: str, byte_count: int) -> None:
        """Note `byte_count` bytes handed to the consumer for `lease_key` now."""
        if byte_count < 0:
            raise InvalidMetricInput(f"byte count for {lease_key!r} must not be negative: {byte_count}")
        now = self._clock.monotonic()
        with self._lock:
            stats = self._leases.setdefault(lease_key, _LeaseStats())
            stats.deliveries.append((now, byte_count))
            self._expire(stats, now)

    def seed(self, lease_key: str, stored_kibps: float) -> None:
        """Start a newly acquired lease's EMA from the throughput its previous owner stored."""
        if not math.isfinite(stored_kibps) or stored_kibps < 0:
            raise InvalidMetricInput(f"stored throughput for {lease_key!r} must be finite and >= 0: {stored_kibps}")
        with self._lock:
            self._leases.setdefault(lease_key, _LeaseStats()).ema = stored_kibps

    def compute(self, lease_key: str) -> float | None:
        """The smoothed KiB/s over the last window, rounded to 6 decimals; None if the lease was never recorded."""
        now = self._clock.monotonic()
        with self._lock:
            stats = self._leases.get(lease_key)
            if stats is None:
                return None
            self._expire(stats, now)
            raw = sum(size for _, size in stats.deliveries) / _BYTES_PER_KIB / self._window
            previous = stats.ema
            smoothed = raw if previous is None else self._alpha * raw + (1 - self._alpha) * previous
            reported = round6(smoothed)
            # The EMA itself stays unrounded (rounding it would stick at 0.000001), except that it snaps to 0.0 once
            # it reports 0.0, so an idle lease ends at a true zero rather than a tail of denormals.
            stats.ema = smoothed if reported else 0.0
            return reported

    def drop(self, lease_key: str) -> None:
        """Forget a lease this worker no longer holds."""
        with self._lock:
            self._leases.pop(lease_key, None)

    def lease_keys(self) -> frozenset[str]:
        """The leases currently tracked."""
        with self._lock:
            return frozenset(self._leases)

    def _expire(self, stats: _LeaseStats, now: float) -> None:
        cutoff = now - self._window
        while stats.deliveries and stats.deliveries[0][0] <= cutoff:
            stats.deliveries.popleft()
