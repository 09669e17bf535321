"""Records/s through the shardherd Spark source vs a bare boto3 GetRecords read of the same shards, same run.

    python -m bench.spark_pipeline --records 20000 --shards 4

Starts a local stack (moto server, kinesalite, coordinator) and a local[2] SparkSession, produces the records, then:
1. bare: one boto3 client reads every shard from TRIM_HORIZON until caught up (GetRecords, 10000 per call);
2. source: an availableNow query of the shardherd source into the checkpointing sink with a no-op write (persist,
   per-shard summary, lease-table checkpoints), caps of `--cap` records per shard per batch.
Reports records/s for both, micro-batch latency (triggerExecution) and the agent's heartbeat gaps during the query.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

from agent.spark.driver import SparkAgent
from agent.spark.offsets import Caps
from examples.local_stack import LocalStack, local_spark


def bare_read(stack: LocalStack) -> int:
    """Read every shard to its tip with plain boto3 calls; returns the record count."""
    client = stack.kinesis
    total = 0
    for shard in client.list_shards(StreamName=stack.app)["Shards"]:
        iterator = client.get_shard_iterator(StreamName=stack.app, ShardId=shard["ShardId"],
                                             ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            response = client.get_records(ShardIterator=iterator, Limit=10_000)
            total += len(response["Records"])
            if not response["Records"] and not response.get("MillisBehindLatest"):
                break
            iterator = response.get("NextShardIterator")
    return total


class HeartbeatWatch(threading.Thread):
    """Polls the worker row every 20 ms and records the gaps between heartbeat increments."""

    def __init__(self, agent: SparkAgent) -> None:
        super().__init__(daemon=True)
        self._agent = agent
        self.gaps: list[float] = []
        self.halt = threading.Event()

    def run(self) -> None:
        last_count, last_at = -1, time.monotonic()
        while not self.halt.wait(0.02):
            record = self._agent.store.get_worker(self._agent.settings.worker_id)
            if record is not None and record.heartbeat != last_count:
                now = time.monotonic()
                if last_count >= 0:
                    self.gaps.append(now - last_at)
                last_count, last_at = record.heartbeat, now


def main() -> None:
    parser = argparse.ArgumentParser(description="shardherd Spark source throughput vs bare boto3")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--cap", type=int, default=2_500)
    args = parser.parse_args()
    with LocalStack(f"bench-spark-{int(time.time())}", args.shards) as stack:
        spark = local_spark("shardherd-bench")
        spark.range(10).count()  # JVM and Python workers warm, outside the measured time
        agent = SparkAgent(stack.settings("bench-driver"), caps=Caps(args.cap), probe_interval=0.2,
                           min_call_interval=0.0).start()
        stack.wait_owned("bench-driver")
        stack.produce(args.records, args.size)

        started = time.monotonic()
        bare = bare_read(stack)
        bare_seconds = time.monotonic() - started

        while not all(view.pending for view in agent.book.snapshot().shards.values()):
            time.sleep(0.05)
        counted: list[int] = []

        def noop(df: Any, batch_id: int) -> None:
            counted.append(0)

        watch = HeartbeatWatch(agent)
        watch.start()
        started = time.monotonic()
        query = agent.run_query(spark, noop, f"/tmp/{stack.app}-checkpoint", available_now=True)
        query.awaitTermination()
        source_seconds = time.monotonic() - started
        watch.halt.set()
        progress = query.recentProgress
        rows = sum(int(item["numInputRows"]) for item in progress)
        batches = [item["durationMs"]["triggerExecution"] / 1000 for item in progress if item["numInputRows"]]
        print(f"records produced      {args.records} x {args.size} B over {args.shards} shards")
        print(f"bare boto3 read       {bare} records in {bare_seconds:.2f} s = {bare / bare_seconds:,.0f} rec/s")
        print(f"shardherd source      {args.records} records in {source_seconds:.2f} s (query start included) = "
              f"{args.records / source_seconds:,.0f} rec/s; ratio {bare_seconds / source_seconds:.2f} of bare")
        print(f"  input rows (every scan counted) {rows}; batches {len(counted)} of <= {args.cap} per shard")
        if batches:
            print(f"  micro-batch latency median {statistics.median(batches):.2f} s, max {max(batches):.2f} s")
        if watch.gaps:
            print(f"  heartbeat gaps during the query: max {max(watch.gaps):.2f} s, median "
                  f"{statistics.median(watch.gaps):.2f} s (failover {stack.base['failover_time_millis'] / 1000} s)")
        agent.stop(drain=False)
        spark.stop()


if __name__ == "__main__":
    main()
