"""A Spark agent books each committed batch's bytes at its records' arrival times (agent/spark/driver.py).

Booked at commit time, over the time since the previous commit, a shard's figure measured how fast Spark committed,
not how fast records arrived: when batches are capped and spaced irregularly (a reader behind the stream) the live
figures varied with sd/mean 0.5-0.7 where plain agents' varied 0.04-0.08 (bench/churn.py --noise).
"""

from __future__ import annotations

import random
import statistics

from shardherd.agent.metrics.throughput import ThroughputRecorder
from shardherd.shared.clock import ManualClock

PART_BYTES = 1024  # a second's records of a 1 KiB/s shard


def _spread(by_arrival: bool) -> tuple[float, float]:
    """sd/mean and mean of the figure of a steady 1 KiB/s shard read in capped batches at irregular intervals."""
    clock = ManualClock()
    recorder = ThroughputRecorder(clock, 30.0, 0.5)
    recorder.track("k")
    rng = random.Random(3)
    waiting: list[tuple[int, float]] = []  # (bytes, arrival) of each second's records
    figures: list[float] = []
    commit_at = 2
    for second in range(1, 241):
        clock.advance(1.0)
        waiting.append((PART_BYTES, clock.time() - 1.0))
        if second >= commit_at:
            covered, waiting = waiting[:6], waiting[6:]  # a capped batch: at most six seconds' records
            total = sum(size for size, _ in covered)
            if by_arrival:  # the batch's first and last arrival, as its executors recorded them
                recorder.record("k", total, covered[0][1], covered[-1][1])
            else:
                recorder.record("k", total)
            commit_at = second + rng.choice([1, 2, 6, 9])
        figure = recorder.compute("k")
        if second > 90 and figure is not None:
            figures.append(figure)
    mean = statistics.fmean(figures)
    return statistics.pstdev(figures) / mean, mean


def test_capped_irregular_batches_give_a_steady_figure_when_booked_at_arrival_times() -> None:
    spread, mean = _spread(by_arrival=True)
    assert spread < 0.05 and abs(mean - 1.0) < 0.05
    old_spread, _ = _spread(by_arrival=False)  # the commit-time booking this replaces
    assert old_spread > 0.2
