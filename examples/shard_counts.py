"""Example pipeline: per-shard record counts and bytes as Parquet, idempotent on (shard, sequence, sub-sequence).

One command runs it against a local stack it starts itself (moto server, kinesalite, a coordinator, local Spark):

    python -m examples.shard_counts --records 2000 --out /tmp/shard-counts

Each micro-batch appends the keys and sizes of its records to `<out>/records` (Parquet); Spark's checkpoint lives in
`<out>/checkpoint` and the lease table holds the progress. A replayed batch appends the same keys again, so the
counts in `<out>/counts` are computed over distinct (shard_id, sequence_number, sub_sequence_number) and stay exact.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agent.spark.commit import BatchFunction
from agent.spark.driver import SparkAgent
from agent.spark.offsets import Caps
from examples.local_stack import LocalStack, local_spark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

KEY = ["shard_id", "sequence_number", "sub_sequence_number"]
RECORDS_DDL = ("shard_id STRING, sequence_number STRING, sub_sequence_number BIGINT, bytes INT, "
               "arrival_timestamp TIMESTAMP")


def write_records(out: Path) -> BatchFunction:
    """The foreachBatch function: append the batch's record keys and sizes to `<out>/records`."""

    def write(df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F  # noqa: N812

        (df.select(*KEY, F.length("data").alias("bytes"), "arrival_timestamp")
           .dropDuplicates(KEY).write.mode("append").parquet(str(out / "records")))

    return write


def write_counts(spark: SparkSession, out: Path) -> list[tuple[str, int, int]]:
    """Per-shard counts and bytes over distinct records, written to `<out>/counts`; returns them."""
    from pyspark.sql import functions as F  # noqa: N812

    counts = (spark.read.schema(RECORDS_DDL).parquet(str(out / "records")).dropDuplicates(KEY).groupBy("shard_id")
              .agg(F.count(F.lit(1)).alias("records"), F.sum("bytes").alias("bytes")).orderBy("shard_id"))
    counts.write.mode("overwrite").parquet(str(out / "counts"))
    return [(row["shard_id"], row["records"], row["bytes"]) for row in counts.collect()]


def main() -> None:
    """Start the local stack, produce records, run the pipeline until every record is counted, print the counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("shard-counts"))
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with LocalStack(f"example-{int(time.time())}", args.shards) as stack:
        spark = local_spark("shardherd-example")
        agent = SparkAgent(stack.settings("example-driver"), caps=Caps(1000), probe_interval=0.5).start()
        stack.wait_owned("example-driver")
        stack.produce(args.records)
        sink = write_records(args.out)
        query = agent.run_query(spark, sink, str(args.out / "checkpoint"), processing_time="1 second")
        deadline = time.monotonic() + args.timeout
        counted = 0
        while counted < args.records and time.monotonic() < deadline and query.isActive:
            time.sleep(2)
            if (args.out / "records").exists():
                counted = sum(records for _, records, _ in write_counts(spark, args.out))
        agent.stop()
        for shard, records, size in write_counts(spark, args.out):
            print(f"{shard}: {records} records, {size} bytes")
        print(f"{counted} of {args.records} records counted; Parquet in {args.out}")
        spark.stop()


if __name__ == "__main__":
    main()
