"""How a worker's metric (CPU) relates to the throughput it carries: the line the decider projects moves with.

KCL projects every move as if the metric were proportional to throughput, which overstates each move by the part of
the value a worker has with no leases at all (an idle process still uses CPU), so balancing undershoots and needs
more runs. shardherd fits `value = base + slope x throughput` over the fleet each run and uses it when the fleet's
points make it trustworthy (enough workers, enough spread in throughput, a good fit); otherwise it falls back to
KCL's proportional model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# When the fleet's (throughput, value) points are trusted for a fit.
MIN_FIT_POINTS = 3
MIN_FIT_SPREAD = 0.2  # standard deviation of throughput over its mean
MIN_FIT_R2 = 0.8
MAX_BASE_SHARE = 0.75  # the fitted base never exceeds this share of the fleet average


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
