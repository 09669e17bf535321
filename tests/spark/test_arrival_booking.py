"""A Spark agent books each committed batch's bytes at the records' arrival times (agent/spark/book.py).

Booked at commit time, over the time since the previous commit, a shard's figure measured how fast Spark committed,
not how fast records arrived: when batches are capped and spaced irregularly (a reader behind the stream) the live
figures varied with sd/mean 0.5-0.7 where plain agents' varied 0.04-0.08 (bench/churn.py --noise).
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path

from shardherd.agent.metrics.throughput import ThroughputRecorder
from shardherd.agent.spark.book import ShardBook, arrival_spans
from shardherd.agent.spark.channel import Segment
from shardherd.agent.spark.probe import ProbeResult
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.clock import ManualClock
from shardherd.shared.lease import Lease

PART_BYTES = 1024  # one probe per second of a 1 KiB/s shard


def _spread(by_arrival: bool) -> tuple[float, float]:
    """sd/mean and mean of the figure of a steady 1 KiB/s shard read in capped batches at irregular intervals."""
    clock = ManualClock()
    recorder = ThroughputRecorder(clock, 30.0, 0.5)
    recorder.track("k")
    rng = random.Random(3)
    waiting: list[Segment] = []
    figures: list[float] = []
    commit_at = 2
    for second in range(1, 241):
        clock.advance(1.0)
        waiting.append(Segment(Checkpoint(str(second)), 10, PART_BYTES, clock.time() - 1.0))
        if second >= commit_at:
            covered, waiting = tuple(waiting[:6]), waiting[6:]  # a capped batch: at most six probes' records
            total = sum(part.bytes for part in covered)
            spans = arrival_spans(covered, total) if by_arrival else None
            if spans is None:
                recorder.record("k", total)
            else:
                for size, first, last in spans:
                    recorder.record("k", size, first, last)
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


def test_a_checkpoint_returns_the_probed_segments_it_covered(tmp_path: Path) -> None:
    book = ShardBook("w", tmp_path, merge_below=100)
    book.acquired(Lease("s", lease_owner="w"))
    tenure = book.snapshot().shards["s"].tenure
    parts = [Segment(Checkpoint("11"), 3, 30, 1.0), Segment(Checkpoint("12"), 2, 20, 2.0),
             Segment(Checkpoint("13"), 4, 40, 3.5)]
    for part in parts:
        book.probed("s", book.snapshot().shards["s"].frontier, ProbeResult(part))
    assert book.checkpointed("s", "another hold", Checkpoint("12")) == ()
    covered = book.checkpointed("s", tenure, Checkpoint("12"))
    assert covered == tuple(parts[:2])
    assert arrival_spans(covered, 50) == [(30, 1.0, 2.0), (20, 2.0, 2.0)]
    assert arrival_spans(covered, 49) is None  # not the batch's bytes: booked the old way
    assert arrival_spans((Segment(Checkpoint("13"), 4, 40, None),), 40) is None
