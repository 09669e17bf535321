"""The example pipeline: per-shard record counts and bytes as Parquet, idempotent on (shard, sequence, sub-sequence).

Each driver appends the keys and sizes of its micro-batches' records to its own directory `<out>/records/<worker>`
(concurrent Spark writers must not share an output directory). A batch replayed after a crash, possibly on another
driver, appends the same keys again, so counts are taken over distinct keys across all drivers' directories.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from shardherd.agent.spark.commit import BatchFunction

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

KEY = ["shard_id", "sequence_number", "sub_sequence_number"]
RECORDS_DDL = ("shard_id STRING, sequence_number STRING, sub_sequence_number BIGINT, bytes INT, "
               "arrival_timestamp TIMESTAMP")
ShardCount = tuple[str, int, int]


def records_dir(out: Path, worker: str) -> Path:
    """Where `worker`'s driver appends its records."""
    return out / "records" / worker


def write_records(target: Path) -> BatchFunction:
    """The foreachBatch function: append the batch's record keys and sizes to the Parquet directory `target`.

    One stage, no shuffle: a batch holds each key once (its plans read each record once), so nothing is
    de-duplicated here, and a duplicate would show in the counts rather than be hidden. The shard partitions are
    coalesced to one file per core (one per batch on the stack's `local[1]` drivers); the shuffle a de-duplication
    needed, or a file per shard, made every batch slower, and with it every handoff to this driver.
    """

    def write(df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F  # noqa: N812

        cores = df.sparkSession.sparkContext.defaultParallelism
        (df.select(*KEY, F.length("data").alias("bytes"), "arrival_timestamp")
           .coalesce(cores).write.mode("append").parquet(str(target)))

    return write


def write_counts(spark: SparkSession, out: Path) -> list[ShardCount]:
    """Per-shard counts and bytes over distinct records of every driver, written to `<out>/counts`; returns them."""
    from pyspark.sql import functions as F  # noqa: N812

    if not any((out / "records").glob("*/*.parquet")):  # no driver wrote a batch yet (stopped early): no counts
        return []
    records = spark.read.schema(RECORDS_DDL).parquet(str(out / "records" / "*"))
    counts = (records.dropDuplicates(KEY).groupBy("shard_id")
              .agg(F.count(F.lit(1)).alias("records"), F.sum("bytes").alias("bytes")).orderBy("shard_id"))
    counts.write.mode("overwrite").parquet(str(out / "counts"))
    return [(row["shard_id"], row["records"], row["bytes"]) for row in counts.collect()]


def distinct_records(records: Path) -> dict[str, int]:
    """Distinct records per shard under the Parquet directory `records` (all drivers' `<out>/records`, or one's).

    Read with pyarrow, so no Spark session is needed; Spark's `_temporary` and `_SUCCESS` entries are skipped.
    """
    import pyarrow.dataset as ds  # type: ignore[import-untyped]

    if not records.is_dir():
        return {}
    dataset = ds.dataset(records, format="parquet")
    if not dataset.files:  # stopped before a first batch was written: no schema to select from
        return {}
    table = dataset.to_table(columns=KEY)
    distinct = table.group_by(KEY).aggregate([]).group_by("shard_id").aggregate([([], "count_all")])
    return dict(zip(distinct.column("shard_id").to_pylist(), distinct.column("count_all").to_pylist(), strict=True))
