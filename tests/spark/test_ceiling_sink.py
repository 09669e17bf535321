"""The ceiling bench's Spark sinks (bench/ceiling.py `counting_sink`): both count every row; the noop sink is one
stage, the global aggregation two (its second waits for a free task slot: the bench's cost, not the pipeline's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from bench.ceiling import SINKS, Counted, counting_sink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow


def _stages(spark: SparkSession, group: str) -> int:
    """Stages the jobs of one job group ran."""
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
    return sum(len(job.stageIds) for job in jobs if job is not None)


def test_both_sinks_count_every_row_and_the_noop_sink_runs_one_stage(spark: SparkSession) -> None:
    """A few seconds on a running session: 3 batches per sink."""
    from pyspark.sql import functions as F  # noqa: N812

    rows = spark.range(300, numPartitions=2).select(F.expr("repeat('x', id % 7)").cast("binary").alias("data"))
    empty = rows.limit(0)
    stages: dict[str, int] = {}
    for sink in SINKS:
        counted, took = Counted(), dict[int, float]()
        write = counting_sink(counted, took, sink)
        spark.sparkContext.setJobGroup(f"sink-{sink}", sink)
        write(rows, 1)
        spark.sparkContext.setJobGroup(f"other-{sink}", sink)
        write(empty, 2)
        write(rows, 3)
        stages[sink] = _stages(spark, f"sink-{sink}")
        assert (counted.records, counted.batches) == (600, 2)  # the empty batch counts no batch
        assert set(took) == {1, 2, 3}
    assert stages["noop"] == 1 and stages["aggregate"] >= 2
    with pytest.raises(ValueError, match="sink must be one of"):
        counting_sink(Counted(), sink="console")
