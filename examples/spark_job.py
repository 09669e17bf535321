"""A Spark Structured Streaming job that reads a Kinesis stream through shardherd: the job the agent image ships.

    spark-submit [Spark options] /opt/app/spark_job.py [--output URI] [--checkpoint DIR] [--trigger "2 seconds"]

Settings come from SHARDHERD_* variables (application, stream, region, coordinator URL, SHARDHERD_WORKER_ID). The
driver embeds the shardherd agent, so this Spark application is one worker of the lease table and each micro-batch
reads the shards that worker holds, at most a task per core. Without `--output` each batch logs its per-shard record
counts and bytes (a sink that needs no connector jar); with `--output` it appends the rows as Parquet there
(`s3a://bucket/prefix` needs hadoop-aws on the classpath: docs/spark.md). SIGTERM or SIGINT (Ctrl-C) drains: the
leader hands the shards to the other drivers after their last batch was checkpointed, then the job exits 0; a query
that ends by itself exits 1. The default checkpoint directory is the job's own (named after its worker id).
"""

from __future__ import annotations

import argparse
import logging
import re
import tempfile
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from shardherd import BatchFunction, Caps, SparkAgent, load_settings, stop_signals

log = logging.getLogger("spark_job")


def log_counts(df: DataFrame, batch_id: int) -> None:
    """The default sink: records and bytes per stream and shard of the batch, in the driver's log (one Spark job)."""
    per_shard = df.groupBy("stream_name", "shard_id").agg(F.count(F.lit(1)).alias("records"),
                                                          F.sum(F.length("data")).alias("bytes"))
    for row in sorted(per_shard.collect()):
        log.info("batch %d: %s/%s %d records %d bytes", batch_id, row["stream_name"], row["shard_id"], row["records"],
                 row["bytes"])


def parquet_sink(output: str) -> BatchFunction:
    """A sink appending every row to Parquet under `output` (a path, `file://` or `s3a://` URI)."""

    def write(df: DataFrame, batch_id: int) -> None:
        df.write.mode("append").parquet(output)

    return write


def default_checkpoint(worker_id: str) -> str:
    """A checkpoint directory of this job alone: two jobs on one host have different worker ids."""
    return str(Path(tempfile.gettempdir()) / "shardherd-job" / re.sub(r"[^\w.-]", "_", worker_id) / "checkpoint")


def main(argv: list[str] | None = None) -> int:
    """Run the query until SIGTERM/SIGINT (exit 0 after the drain) or until it ends by itself (exit 1)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", help="append rows as Parquet here (default: log per-shard counts)")
    parser.add_argument("--checkpoint", help="Spark's checkpoint location (plans only: progress lives in the lease "
                        "table; default: a directory of this job's worker id under the temporary directory)")
    parser.add_argument("--trigger", default="2 seconds", help="processing-time trigger interval")
    parser.add_argument("--max-records", type=int, default=5000, help="Kinesis records per shard per batch")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = load_settings()
    stopping = stop_signals()  # a stop while the JVM starts: the job ends before it takes any lease
    spark = SparkSession.builder.appName("shardherd-spark-job").config("spark.speculation", "false").getOrCreate()
    # Again after the session: its SparkContext replaced the SIGINT handler with one that raises KeyboardInterrupt,
    # which would skip the drain.
    stop_signals(spark, stopping)
    if stopping.is_set():
        spark.stop()
        return 0
    agent = SparkAgent(settings, caps=Caps(max_records=args.max_records))
    write = parquet_sink(args.output) if args.output else log_counts
    checkpoint = args.checkpoint or default_checkpoint(settings.worker_id)
    query = agent.run_query(spark, write, checkpoint_location=checkpoint, processing_time=args.trigger)
    while query.isActive and not stopping.wait(0.5):
        pass
    ended_by_itself = not stopping.is_set()
    if ended_by_itself:
        log.error("the query ended: %s", agent.stopped_because or query.exception())
    agent.stop()  # drain while the query runs, then stop the query
    spark.stop()
    return 1 if ended_by_itself else 0


if __name__ == "__main__":
    raise SystemExit(main())
