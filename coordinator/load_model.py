"""How a worker's metric (CPU) relates to the throughput it carries: the line the decider projects moves with.

KCL projects every move as if the metric were proportional to throughput, which overstates each move by the part of
the value a worker has with no leases at all (an idle process still uses CPU), so balancing undershoots and needs
more runs. shardherd fits `value = base + slope x throughput` over the fleet each run and uses it when the fleet's
points make it trustworthy (enough workers, enough spread in throughput, a good fit); otherwise it falls back to
KCL's proportional model.

A worker may also have CPU of its own that no lease explains (a Spark driver's JVM beside plain agents): `own_base`
reads it from the worker's own reports where its throughput moved and its value did not follow (decision 0044).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# When the fleet's (throughput, value) points are trusted for a fit.
MIN_FIT_POINTS = 3
MIN_FIT_SPREAD = 0.2  # standard deviation of throughput over its mean
MIN_FIT_R2 = 0.8
MAX_BASE_SHARE = 0.75  # the fitted base never exceeds this share of the fleet average
# A worker's own reports tell its base only with at least this many, two or more of them at each end of a throughput
# span of MIN_FIT_SPREAD of the highest (one report's figure reading 0 is no experiment).
MIN_OWN_REPORTS = 4


@dataclass(frozen=True, slots=True)
class Line:
    """`value = base + slope x throughput` for one metric."""

    base: float
    slope: float


def proportional(average: float, mean_throughput: float) -> Line:
    """KCL's model: a worker carrying the mean throughput sits at the fleet average, and 0 throughput means 0."""
    slope = average / mean_throughput if mean_throughput > 0 else 0.0
    return Line(0.0, slope if math.isfinite(slope) else 0.0)


def fit_line(points: Sequence[tuple[float, float]], average: float) -> Line | None:
    """The least-squares line through (throughput, value) points, or None if the points do not support one.

    The base is kept within [0, the lowest value, 3/4 of the average]: an overstated base would make the leader
    believe moves change little and overshoot, while an understated one only costs another run.
    """
    if len(points) < MIN_FIT_POINTS:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var_x = sum((x - mean_x) ** 2 for x in xs)
    var_y = sum((y - mean_y) ** 2 for y in ys)
    if mean_x <= 0 or var_x <= 0 or var_y <= 0 or math.sqrt(var_x / len(xs)) < MIN_FIT_SPREAD * mean_x:
        return None
    cov = sum((x - mean_x) * (y - mean_y) for x, y in points)
    if cov <= 0 or (cov / var_x) * (cov / var_y) < MIN_FIT_R2:  # (r squared; var_x x var_y may underflow to 0)
        return None
    base = max(0.0, min(mean_y - cov / var_x * mean_x, min(ys), MAX_BASE_SHARE * average))
    return Line(base, (mean_y - base) / mean_x)


def own_base(carried: Sequence[float], values: Sequence[float], slope: float) -> float | None:
    """A worker's value at 0 KiB/s from its own reports, or None where they cannot tell it from its leases' load.

    `carried` and `values`: the KiB/s it carried at each report and the report's value (aligned from the newest; a
    failed sample, < 0, is skipped). Only reports whose throughput moved tell anything: the second highest and the
    second lowest KiB/s must be MIN_FIT_SPREAD of the higher apart (a shed or a fill moved it; all at 0 KiB/s: its
    value is its base). The reports above and below the middle of that span then give its own rate, the change of
    their median values over that of their mean KiB/s, at least the fleet's `slope` (a value that stayed while the
    throughput moved is the worker's own, one that followed is its leases'), and the base is the lower of the two
    groups' medians of each report less that rate times its KiB/s: both ends of the span must show it. Medians, so
    that neither a short excursion nor the report a move straddled (the lease counted already, not yet processed)
    sways it.
    """
    points = [(kbps, value) for kbps, value in zip(reversed(carried), reversed(values), strict=False) if value >= 0]
    if len(points) < MIN_OWN_REPORTS:
        return None
    ranked = sorted(kbps for kbps, _ in points)
    if ranked[-2] - ranked[1] < MIN_FIT_SPREAD * ranked[-2]:
        return None
    middle = (ranked[0] + ranked[-1]) / 2
    low = [(kbps, value) for kbps, value in points if kbps <= middle]
    high = [(kbps, value) for kbps, value in points if kbps > middle]
    rate = max(slope, _own_rate(low, high))
    return min(statistics.median(value - rate * kbps for kbps, value in end) for end in (low, high) if end)


def _own_rate(low: Sequence[tuple[float, float]], high: Sequence[tuple[float, float]]) -> float:
    """How much the median value rises per KiB/s from the `low` reports (KiB/s, value) to the `high` ones.

    0 if none is high (every report at the same KiB/s).
    """
    if not high:
        return 0.0
    rise = statistics.median(v for _, v in high) - statistics.median(v for _, v in low)
    return rise / (statistics.fmean(k for k, _ in high) - statistics.fmean(k for k, _ in low))
