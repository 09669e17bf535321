"""Worker metric values as KCL 3.x reads them: the moving average of a history, a worker's status, its room to grow.

Shared by the variance strategies (coordinator/deciders/), the metric basis of mixed fleets, the agent's own report
check and the API's worker view, so every part reads a metric history the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from shardherd.coordinator.moves import WorkerStatus
from shardherd.coordinator.snapshot import WorkerView
from shardherd.shared.worker import FAILED_SAMPLE


def ema(values: Sequence[float], alpha: float) -> float:
    """KCL's moving average over a metric history, oldest first: first sample as is, -1 (failed) samples skipped."""
    result: float | None = None
    for value in values:
        if value == FAILED_SAMPLE:
            continue
        result = value if result is None else alpha * value + (1.0 - alpha) * result
    return 0.0 if result is None else result


def classify(worker: WorkerView) -> WorkerStatus:
    """Valid and reporting (ACTIVE), malformed metrics (INVALID_METRICS) or a last sample of -1 (FAILING_METRIC)."""
    if worker.uses_default_metric:
        return WorkerStatus.ACTIVE
    if not worker.metric_stats:
        return WorkerStatus.INVALID_METRICS
    for metric, history in worker.metric_stats.items():
        limit = worker.operating_range.get(metric)
        if not limit or not limit[0] > 0 or math.isinf(limit[0]):
            return WorkerStatus.INVALID_METRICS
        if any(not math.isfinite(v) or (v < 0 and v != FAILED_SAMPLE) for v in history):
            return WorkerStatus.INVALID_METRICS
    if any(history and history[-1] == FAILED_SAMPLE for history in worker.metric_stats.values()):
        return WorkerStatus.FAILING_METRIC
    return WorkerStatus.ACTIVE


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
