"""Worker metric values as KCL 3.x reads them: a worker's status, the moving average of a history, its room to grow.

Shared by the leader (the strategies in coordinator/deciders/, the metric basis of mixed fleets), the agent's own
report check and the API's worker view, so every part reads a metric report the same way.

Invariants:
* A report with neither metrics nor operating range is a default-metric worker (balanced by throughput): ACTIVE.
* A report is INVALID_METRICS when a metric has no positive, finite operating-range maximum or a sample that is not
  finite or negative other than the failed-interval mark -1; FAILING_METRIC when, valid, its last sample of any metric
  is -1; ACTIVE otherwise. DRAINING is the leader's judgement from the drain flag, never a report's.
* -1 samples never enter a moving average; a history of only -1 averages to 0.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from typing import Protocol

from shardherd.shared.worker import FAILED_SAMPLE


class WorkerStatus(enum.Enum):
    """How the leader treats a worker in a run (its report's status, or DRAINING)."""

    ACTIVE = "ACTIVE"
    DRAINING = "DRAINING"
    INVALID_METRICS = "INVALID_METRICS"
    FAILING_METRIC = "FAILING_METRIC"


class MetricReport(Protocol):
    """What a worker reports: metric histories (`sts`, oldest first) and operating ranges (`opr`)."""

    @property
    def metric_stats(self) -> Mapping[str, Sequence[float]]:
        """Metric -> recent per-interval values, oldest first (-1 = a failed interval)."""

    @property
    def operating_range(self) -> Mapping[str, Sequence[float]]:
        """Metric -> [maximum utilisation]."""


def ema(values: Sequence[float], alpha: float) -> float:
    """KCL's moving average over a metric history, oldest first: first sample as is, -1 (failed) samples skipped."""
    result: float | None = None
    keep = 1.0 - alpha
    for value in values:
        if value == FAILED_SAMPLE:
            continue
        result = value if result is None else alpha * value + keep * result
    return 0.0 if result is None else result


def classify(worker: MetricReport) -> WorkerStatus:
    """Valid and reporting (ACTIVE), malformed metrics (INVALID_METRICS) or a last sample of -1 (FAILING_METRIC)."""
    if not worker.metric_stats and not worker.operating_range:  # a default-metric worker
        return WorkerStatus.ACTIVE
    if not worker.metric_stats:
        return WorkerStatus.INVALID_METRICS
    failing = False  # (told after every metric is known valid: invalid metrics win)
    for metric, history in worker.metric_stats.items():
        limit = worker.operating_range.get(metric)
        if not limit or not limit[0] > 0 or math.isinf(limit[0]):
            return WorkerStatus.INVALID_METRICS
        if _bad_sample(history):
            return WorkerStatus.INVALID_METRICS
        failing = failing or (bool(history) and history[-1] == FAILED_SAMPLE)
    return WorkerStatus.FAILING_METRIC if failing else WorkerStatus.ACTIVE


def _bad_sample(history: Sequence[float]) -> bool:
    """Whether a sample is not finite, or negative but not the failed mark -1.

    A history of finite samples >= 0 is told in two C-level passes first: the leader reads thousands per run.
    """
    if history and min(history) >= 0 and math.isfinite(sum(history)):
        return False
    return any(not math.isfinite(v) or (v < 0 and v != FAILED_SAMPLE) for v in history)


def room(values: Mapping[str, float], averages: Mapping[str, float]) -> float:
    """KCL's room to grow: least `(avg - v) / v` over the worker's metrics; v = 0 gives +inf (0 if avg is 0 too)."""
    best = math.inf
    for metric, value in values.items():
        avg = averages[metric]
        if value > 0:
            best = min(best, (avg - value) / value)
        elif avg <= 0:
            best = min(best, 0.0)
    return best
