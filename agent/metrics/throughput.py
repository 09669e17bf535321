"""Per-lease throughput in KiB/s of the data arriving in the shard (KCL's LeaseStatsRecorder).

Each delivery is recorded with the arrival times of its records (Kinesis' ApproximateArrivalTimestamp, wall-clock
seconds) when the reader knows them, else with the clock's wall time. `compute` turns the bytes whose arrival falls in
the last `window` seconds into KiB/s and smooths that with an EMA (alpha 0.5, first value as is). Differences from
KCL, on purpose, each found by the live churn bench (bench/churn.py):

* The rate is that of the data arriving in the shard, not of the reads: a new owner that reads a handoff's backlog in
  one burst, or a Spark batch that commits several seconds of records at once, does not show a spike (the balancer
  took such spikes for load and moved the lease back).
* The window is long (`lease_throughput_window_millis`, 30 s by default) instead of one renewal interval (3.3 s):
  a few KiB/s of Zipf-keyed, KPL-aggregated records over 3 s vary by tens of percent, more than the balancing band.
* A lease is reported only once this owner has covered half a window (`compute` answers None before, unless the
  previous owner's stored figure seeded it), instead of the few seconds a new owner has seen.
* Seeding from a stored `throughputKBps` makes the stored value the EMA's previous value, so the new owner's value
  carries on from the old owner's (KCL divides the seed by the window in seconds).
* Once an idle lease's value rounds to 0.0 its EMA is exactly 0.0, not an endless run of ever smaller denormals.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field

from shardherd.agent.metrics import InvalidMetricInput
from shardherd.shared.clock import Clock
from shardherd.shared.config import Settings
from shardherd.shared.rounding import round6

DEFAULT_ALPHA = 0.5
_BYTES_PER_KIB = 1024.0
# A reader further behind than this share of the window counts the missing recent part as quiet rather than unknown,
# so a shard that stops receiving data decays to 0 instead of keeping its last rate forever. Readers that know they
# are caught up say so (an empty read at no lag records 0 bytes up to now); a stalled Spark batch is not idleness.
_MAX_LAG_SHARE = 1.0
MATURE_SHARE = 0.5  # the share of a window a new owner must cover before its figure is reported


@dataclass(slots=True)
class _Delivery:
    first: float  # arrival time of the first record of the delivery (wall clock)
    last: float  # arrival time of the last record
    size: int


@dataclass(slots=True)
class _LeaseStats:
    covered_from: float  # every record arriving after this is (or will be) recorded by this owner
    deliveries: deque[_Delivery] = field(default_factory=deque)
    frontier: float | None = None  # newest arrival time recorded
    ema: float | None = None


class ThroughputRecorder:
    """Bytes arriving per lease over a sliding window of arrival times, reported as a smoothed KiB/s; thread-safe."""

    def __init__(self, clock: Clock, window_seconds: float, alpha: float = DEFAULT_ALPHA) -> None:
        if not window_seconds > 0 or not 0 < alpha <= 1:
            raise InvalidMetricInput(f"window_seconds must be > 0 and alpha in (0, 1]: {window_seconds}, {alpha}")
        self._clock = clock
        self._window = window_seconds
        self._alpha = alpha
        self._leases: dict[str, _LeaseStats] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_settings(cls, clock: Clock, settings: Settings) -> ThroughputRecorder:
        """The recorder an agent uses: `lease_throughput_window_millis` and the metrics EMA's alpha."""
        return cls(clock, settings.lease_throughput_window_millis / 1000, settings.worker_metrics_ema_alpha)

    @property
    def window_seconds(self) -> float:
        """The measurement window."""
        return self._window

    def track(self, lease_key: str) -> None:
        """Start measuring a newly acquired lease: every record arriving from now on will be recorded."""
        with self._lock:
            self._stats(lease_key, self._clock.time())

    def record(self, lease_key: str, byte_count: int, first_arrival: float | None = None,
               last_arrival: float | None = None) -> None:
        """Note `byte_count` bytes delivered for `lease_key`, whose records arrived between the two times (epoch s).

        Without arrival times the delivery counts as arriving now; with only the last one, the bytes are spread from
        the previous delivery's last arrival.
        """
        if byte_count < 0:
            raise InvalidMetricInput(f"byte count for {lease_key!r} must not be negative: {byte_count}")
        now = self._clock.time()
        with self._lock:
            stats = self._stats(lease_key, now)
            last = now if last_arrival is None else last_arrival
            if first_arrival is not None:
                first = min(first_arrival, last)
                stats.covered_from = min(stats.covered_from, first)
            else:
                first = min(last, stats.frontier if stats.frontier is not None else stats.covered_from)
            stats.deliveries.append(_Delivery(first, last, byte_count))
            stats.frontier = last if stats.frontier is None else max(stats.frontier, last)
            self._expire(stats, now)

    def seed(self, lease_key: str, stored_kibps: float) -> None:
        """Start a newly acquired lease's EMA from the throughput its previous owner stored."""
        if not math.isfinite(stored_kibps) or stored_kibps < 0:
            raise InvalidMetricInput(f"stored throughput for {lease_key!r} must be finite and >= 0: {stored_kibps}")
        with self._lock:
            self._stats(lease_key, self._clock.time()).ema = stored_kibps

    def compute(self, lease_key: str) -> float | None:
        """The smoothed KiB/s over the last window, rounded to 6 decimals.

        None if the lease was never recorded, or this owner has covered less than half a window and has no seed.
        """
        now = self._clock.time()
        with self._lock:
            stats = self._leases.get(lease_key)
            if stats is None:
                return None
            self._expire(stats, now)
            end = now - self._window * _MAX_LAG_SHARE
            if stats.frontier is not None:
                end = max(end, min(stats.frontier, now))
            start = max(end - self._window, stats.covered_from)
            if end - start < self._window * MATURE_SHARE:
                return None if stats.ema is None else round6(stats.ema)
            arrived = sum(_overlap(delivery, start, end) for delivery in stats.deliveries)
            raw = arrived / _BYTES_PER_KIB / (end - start)
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

    def _stats(self, lease_key: str, now: float) -> _LeaseStats:
        stats = self._leases.get(lease_key)
        if stats is None:
            stats = self._leases[lease_key] = _LeaseStats(covered_from=now)
        return stats

    def _expire(self, stats: _LeaseStats, now: float) -> None:
        cutoff = now - 2 * self._window
        while stats.deliveries and stats.deliveries[0].last <= cutoff:
            stats.deliveries.popleft()


def _overlap(delivery: _Delivery, start: float, end: float) -> float:
    """The bytes of a delivery whose (evenly spread) arrival times fall in (start, end]."""
    if delivery.last <= delivery.first:
        return float(delivery.size) if start < delivery.last <= end else 0.0
    inside = min(end, delivery.last) - max(start, delivery.first)
    return delivery.size * inside / (delivery.last - delivery.first) if inside > 0 else 0.0
