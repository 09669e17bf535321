"""The query watch's look at Spark (agent/spark/spark_status.py): what PySpark's StatusTracker says, in a few py4j
round trips however many jobs the group ran (PySpark's own look made one per job id: thousands a second per driver
after a few minutes of micro-batches)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

from shardherd.agent.spark.spark_status import SparkMoves, int_array

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def test_java_int_arrays_as_text_are_read_back() -> None:
    assert int_array("[]") == [] and int_array("[7]") == [7] and int_array("[3, 14, 15]") == [3, 14, 15]


@contextmanager
def counted_commands(spark: SparkSession) -> Iterator[Callable[[], int]]:
    """Count the py4j commands the driver sends to its JVM inside the block."""
    gateway: Any = spark.sparkContext._gateway
    client: Any = gateway._gateway_client
    send = client.send_command
    sent = [0]

    def counting(*args: Any, **kwargs: Any) -> Any:
        sent[0] += 1
        return send(*args, **kwargs)

    client.send_command = counting
    try:
        yield lambda: sent[0]
    finally:
        client.send_command = send


def test_the_latest_job_of_the_group_costs_a_few_round_trips_however_many_jobs_it_ran(spark: SparkSession) -> None:
    group = "spark-status-test"
    context = spark.sparkContext
    context.setJobGroup(group, "jobs the look counts")
    try:
        for size in range(1, 21):
            spark.range(size).count()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    jobs = context.statusTracker().getJobIdsForGroup(group)
    assert len(jobs) >= 20
    moves = SparkMoves(spark, group)
    with counted_commands(spark) as sent:
        latest, stages = moves.now()
    assert latest == max(jobs) and stages == ()  # no stage runs between the jobs
    assert sent() <= 8  # 4 calls (2 arrays as text) and their objects freed; PySpark's own list: one per job id
    assert SparkMoves(spark, "no-such-group").now() == (-1, ())
