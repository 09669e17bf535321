"""How far a query's Spark work has moved, read from the driver's JVM in a few py4j round trips whatever its history.

The Spark supervisor looks every 0.1 s (agent/spark/query_watch.py). PySpark's StatusTracker turns each Java array
it returns into a list one element at a time, a py4j round trip per element: the query's job ids grow by one or two
per batch (Spark keeps up to 1,000), so one look cost hundreds of round trips after a few minutes, a few thousand a
second per driver, taking CPU from the batches it watches. Here each array crosses as one string
(`java.util.Arrays.toString`), and a stage's completed tasks are read alone instead of all its fields.

Invariants: a look costs 3 round trips plus 2 per active stage; it reads nothing but the status tracker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Moves = tuple[int, tuple[tuple[int, int], ...]]


def int_array(text: str) -> list[int]:
    """The integers of a Java `Arrays.toString` of an int array ("[3, 4]"; "[]" for none)."""
    inner = text.strip().removeprefix("[").removesuffix("]")
    return [int(item) for item in inner.split(",") if item.strip()]


class SparkMoves:
    """A value that changes as a job group's Spark work moves on: its latest job, tasks completed in active stages."""

    def __init__(self, spark: SparkSession, group: str) -> None:
        jvm = spark._jvm
        assert jvm is not None
        self._arrays: Any = jvm.java.util.Arrays
        self._tracker: Any = spark.sparkContext._jsc.statusTracker()  # the JavaSparkStatusTracker itself
        self._group = group

    def now(self) -> Moves:
        """The group's latest job id (-1 before any) and (stage, completed tasks) of the context's active stages.

        Spark runs a query's jobs, the sink's own included, in a job group named by its run id; a job short enough
        to start and end between two looks still raises the latest job id.
        """
        stages = []
        for stage in sorted(int_array(str(self._arrays.toString(self._tracker.getActiveStageIds())))):
            info = self._tracker.getStageInfo(stage)
            if info is not None:
                stages.append((stage, int(info.numCompletedTasks())))
        jobs = int_array(str(self._arrays.toString(self._tracker.getJobIdsForGroup(self._group))))
        return max(jobs, default=-1), tuple(stages)
