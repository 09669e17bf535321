"""CPU samples turned into KCL's WorkerMetricStats history (`sts`) and operating range (`opr`).

`sample()` is called every capture period (1 s by default) and keeps raw samples in a bounded queue of 300;
`report()` is called with each worker heartbeat: it drains the queue, appends the average (rounded to 6 decimals) to
a bounded history of `no_of_persisted_metrics_per_worker_metrics` values, or -1 when the interval has no valid sample
(the source failed), and returns the maps a WorkerRecord carries. `SamplingThread` calls `sample()` on the clock's
schedule, starting after a seeded random jitter in [0, period) so a fleet that starts together does not sample in step.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from shardherd.agent.metrics import CpuSource, InvalidMetricInput, MetricSourceError
from shardherd.shared.clock import Clock
from shardherd.shared.rounding import round6
from shardherd.shared.supervision import Supervisor
from shardherd.shared.worker import CPU_METRIC, FAILED_SAMPLE

log = logging.getLogger(__name__)

RAW_SAMPLE_CAPACITY = 300
MAX_UTILISATION_PERCENT = 100.0


@dataclass(frozen=True, slots=True)
class WorkerMetrics:
    """What a worker writes with its heartbeat: `metric_stats` (KCL `sts`) and `operating_range` (KCL `opr`)."""

    metric_stats: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    operating_range: Mapping[str, tuple[float, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SamplerCounters:
    """Samples that did not count, so nothing is lost without a trace: failures, out-of-range values, overflow."""

    failed: int
    rejected: int
    overflowed: int


class MetricsSampler:
    """Collects one CPU source's samples and keeps the per-report history; thread-safe."""

    def __init__(
        self,
        source: CpuSource | None,
        history_size: int,
        raw_capacity: int = RAW_SAMPLE_CAPACITY,
        metric_name: str = CPU_METRIC,
    ) -> None:
        if history_size < 1 or raw_capacity < 1:
            raise InvalidMetricInput(f"history_size ({history_size}) and raw_capacity ({raw_capacity}) must be >= 1")
        self._source = source
        self._metric = metric_name
        self._raw: deque[float] = deque()
        self._raw_capacity = raw_capacity
        self._history: deque[float] = deque(maxlen=history_size)
        self._lock = threading.Lock()
        self._failed = 0
        self._rejected = 0
        self._overflowed = 0

    @property
    def source(self) -> CpuSource | None:
        """The CPU source sampled, or None when metrics are disabled."""
        return self._source

    def counters(self) -> SamplerCounters:
        """How many samples failed, were out of [0, 100], or found the raw queue full (since construction)."""
        with self._lock:
            return SamplerCounters(self._failed, self._rejected, self._overflowed)

    def sample(self) -> float | None:
        """Take one sample into the raw queue; returns it, or None when it failed, was rejected or found no room."""
        if self._source is None:
            return None
        try:
            value = self._source.sample()
        except Exception as exc:  # a source bug must not end sampling; it counts as a failed sample like any other
            log.warning(
                "CPU sample from %s failed: %s", self._source.name, exc, exc_info=not isinstance(exc, MetricSourceError)
            )
            with self._lock:
                self._failed += 1
            return None
        with self._lock:
            if not 0.0 <= value <= MAX_UTILISATION_PERCENT:
                log.warning("CPU sample %r from %s is outside [0, 100]; rejected", value, self._source.name)
                self._rejected += 1
                return None
            if len(self._raw) >= self._raw_capacity:
                log.warning("raw CPU sample queue is full (%d); sample dropped until the next report", len(self._raw))
                self._overflowed += 1
                return None
            self._raw.append(value)
        return value

    def report(self) -> WorkerMetrics:
        """Close the interval: append its average (or -1 without samples) and return the `sts`/`opr` maps."""
        if self._source is None:
            return WorkerMetrics()
        with self._lock:
            drained = list(self._raw)
            self._raw.clear()
            self._history.append(round6(sum(drained) / len(drained)) if drained else FAILED_SAMPLE)
            history = tuple(self._history)
        return WorkerMetrics({self._metric: history}, {self._metric: (MAX_UTILISATION_PERCENT,)})


class SamplingThread:
    """A daemon thread calling `sampler.sample()` every period of the clock, after a random start jitter."""

    def __init__(self, sampler: MetricsSampler, clock: Clock, period_seconds: float, rng: random.Random) -> None:
        if period_seconds <= 0:
            raise InvalidMetricInput(f"sampling period must be positive, got {period_seconds}")
        self._sampler = sampler
        self._clock = clock
        self._period = period_seconds
        self.start_delay = rng.random() * period_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shardherd-cpu-sampler", daemon=True)

    def start(self, supervisor: Supervisor | None = None) -> None:
        """Begin sampling in the background (under `supervisor`: restarted after a failure, the restart counted)."""
        if supervisor is None:
            self._thread.start()
        else:
            self._thread = supervisor.thread(self._thread.name, self._run)

    def stop(self, timeout: float | None = None) -> None:
        """Stop at once (the wait between samples is interrupted) and wait for the thread to end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        next_at = self._clock.monotonic() + self.start_delay
        while not self._stop.wait(max(0.0, next_at - self._clock.monotonic())):
            self._sampler.sample()
            next_at += self._period
            now = self._clock.monotonic()
            if next_at < now:
                next_at = now  # fell behind (a long pause): resume from now rather than sample in a burst
