"""A stream benchmark of the Spark pipeline against a bare boto3 consumer of the same shards, in the same run.

    python -m bench.spark_pipeline                      # quick: 4 shards, 100 B, 3 rate steps of 20 s
    python -m bench.spark_pipeline --shards 8 --size 1024 --kpl --rates 1000,2000,4000,8000 --step-seconds 60

Starts moto server, kinesalite and a coordinator, one Spark driver (local[2]) whose agent owns every shard, a
producer process putting records at a fixed rate, and a bare consumer process (one boto3 client, one thread per
shard, GetRecords of up to 10000 from LATEST at its start, parsing every response as boto3 does). The producer
steps through `--rates` (records/s, each held `--step-seconds`); both consumers read what it writes. Reported:
* start-up, apart: Spark session, then query start to the first batch written;
* per step and consumer: records/s and MiB/s consumed in the step (the first `--settle` seconds excluded), lag
  (records produced but not consumed) at the step's end, end-to-end latency p50/p99 (arrival timestamp to the
  sink's write returning, or to the bare consumer's parse);
* the highest rate each sustains with bounded lag (lag at the step's end below two seconds of production), and the
  Spark/bare ratio of records/s at each step (the ratio at a rate above both capacities compares capacities).
The sink is one Spark job per batch reading every row and column (count, bytes, arrival quantiles).
With `--kpl`, the producer packs user records into KPL aggregates (agent/kpl.py), 100 per Kinesis record.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import queue
import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shardherd.agent.kpl import UserRecord, encode_aggregate
from shardherd.agent.spark.driver import SparkAgent
from shardherd.agent.spark.offsets import Caps
from shardherd.agent.spark.progress_log import PHASES
from shardherd.shared.aws import make_client
from tests.support.stream_stack import local_spark, local_stream_stack

QUANTILES = [index / 100 for index in range(101)]
PER_AGGREGATE = 100
BARE_CALL_SPACING = 0.25  # seconds between one shard's GetRecords calls, at least (under Kinesis's 5 a second)


@dataclass
class Tally:
    """What one consumer reported: (time, records, bytes) events and (time, latency s, weight) samples."""

    events: list[tuple[float, int, int]] = field(default_factory=list)
    latencies: list[tuple[float, float, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, at: float, records: int, size: int, latencies: list[tuple[float, float]]) -> None:
        with self.lock:
            self.events.append((at, records, size))
            self.latencies.extend((at, latency, weight) for latency, weight in latencies)

    def total(self, until: float) -> int:
        with self.lock:
            return sum(records for at, records, _ in self.events if at <= until)

    def window(self, start: float, end: float) -> tuple[int, int, list[tuple[float, float]]]:
        with self.lock:
            records = sum(count for at, count, _ in self.events if start <= at < end)
            size = sum(size for at, _, size in self.events if start <= at < end)
            samples = [(latency, weight) for at, latency, weight in self.latencies if start <= at < end]
        return records, size, samples


def weighted_quantile(samples: list[tuple[float, float]], q: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    total = sum(weight for _, weight in ordered)
    running = 0.0
    for value, weight in ordered:
        running += weight
        if running >= q * total:
            return value
    return ordered[-1][0]


def produce(endpoint: str, stream: str, size: int, kpl: bool, rates: list[tuple[float, float]],
            counts: Any) -> None:
    """Producer process: put records at each (start time, rate) step; `counts` gets user records put so far."""
    client = make_client("kinesis", "us-east-1", endpoint)
    payload = b"x" * size
    sent = 0
    for index, (start, rate) in enumerate(rates):
        end = rates[index + 1][0] if index + 1 < len(rates) else start
        step_sent = 0
        while time.time() < end:
            due = int((time.time() - start) * rate) - step_sent
            if due <= 0:
                time.sleep(0.005)
                continue
            if kpl:
                users = min(due, 500 * PER_AGGREGATE)
                entries = [{"Data": encode_aggregate([UserRecord(f"k{at}", payload)
                                                      for at in range(first, min(users, first + PER_AGGREGATE))]),
                            "PartitionKey": f"p{sent + first}"} for first in range(0, users, PER_AGGREGATE)]
            else:
                users = min(due, 500)
                entries = [{"Data": payload, "PartitionKey": f"p{sent + at}"} for at in range(users)]
            response = client.put_records(StreamName=stream, Records=entries)
            if response.get("FailedRecordCount"):
                time.sleep(0.05)
                continue
            sent += users
            step_sent += users
            counts.value = sent


def bare_consume(endpoint: str, stream: str, out: Any, halt: Any) -> None:
    """Bare consumer process: a thread per shard reading from LATEST with boto3; reports to `out` per response.

    Each shard's calls are at least BARE_CALL_SPACING apart (Kinesis serves 5 GetRecords calls per shard per
    second, 4 leave a margin) and a throttled call (ProvisionedThroughputExceededException, behind the limits
    proxy) is made again after a jittered wait, as an AWS client must; `out` gets ("throttled", 1, 0, []) for each.
    A dropped connection (an emulator on a saturated host resets some) is retried the same way.
    """
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as EndpointUnreachable

    from shardherd.agent.records import DeaggregationCounters, records_from_kinesis

    client = make_client("kinesis", "us-east-1", endpoint)
    shards = [shard["ShardId"] for shard in client.list_shards(StreamName=stream)["Shards"]]
    counters = DeaggregationCounters()
    jitter = random.Random(7)

    def follow(shard: str) -> None:
        iterator = client.get_shard_iterator(StreamName=stream, ShardId=shard,
                                             ShardIteratorType="LATEST")["ShardIterator"]
        last_call = 0.0
        while not halt.is_set():
            time.sleep(max(0.0, last_call + BARE_CALL_SPACING - time.monotonic()))
            last_call = time.monotonic()
            try:
                response = client.get_records(ShardIterator=iterator, Limit=10_000)
            except ClientError as error:
                if error.response["Error"]["Code"] != "ProvisionedThroughputExceededException":
                    raise
                out.put(("throttled", 1, 0, []))
                time.sleep(jitter.uniform(0.2, 1.0))
                continue
            except (EndpointUnreachable, HTTPClientError):
                time.sleep(jitter.uniform(0.2, 1.0))
                continue
            now = time.time()
            users = [user for raw in response["Records"] for user in records_from_kinesis(shard, raw, counters)]
            if users:
                latencies = [(now - user.approximate_arrival_timestamp.timestamp(), 1.0)
                             for user in users[:: max(1, len(users) // 100)] if user.approximate_arrival_timestamp]
                weight = len(users) / max(1, len(latencies))
                out.put((now, len(users), sum(len(user.data) for user in users),
                         [(latency, weight) for latency, _ in latencies]))
            iterator = response["NextShardIterator"]

    threads = [threading.Thread(target=follow, args=(shard,), daemon=True) for shard in shards]
    for thread in threads:
        thread.start()
    out.put(("ready", 0, 0, []))
    halt.wait()


def spark_sink(tally: Tally, first_write: list[float]) -> Any:
    """The pipeline's write: one job reading every row (count, bytes, arrival quantiles), then latency per row."""
    from pyspark.sql import functions as F  # noqa: N812

    def write(df: Any, batch_id: int) -> None:
        row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("data")).alias("b"),
                     F.percentile_approx(F.unix_micros("arrival_timestamp"), QUANTILES, 1000).alias("q")).first()
        now = time.time()
        if row is None or not row["n"]:
            return
        if not first_write:
            first_write.append(now)
        weight = row["n"] / len(QUANTILES)
        tally.add(now, int(row["n"]), int(row["b"] or 0), [(now - micros / 1e6, weight) for micros in row["q"]])

    return write


def _print_steps(args: argparse.Namespace, steps: list[tuple[float, float]], produced: Callable[[float], int],
                 tallies: tuple[Tally, Tally]) -> None:
    """Each step's records/s, MiB/s, lag and latency per consumer, their ratio, and the highest sustained rates."""
    mib = 1024 * 1024
    print(f"{'rate/s':>8} {'consumer':>8} {'rec/s':>9} {'MiB/s':>7} {'lag end':>9} {'p50 s':>7} {'p99 s':>7}")
    sustained = {"spark": 0.0, "bare": 0.0}
    ratios = []
    for index, (start, rate) in enumerate(steps[:-1]):
        end = steps[index + 1][0]
        window = end - (start + args.settle)
        line_rates = {}
        for name, tally in zip(("spark", "bare"), tallies, strict=True):
            records, size, samples = tally.window(start + args.settle, end)
            lag = produced(end) - tally.total(end)
            p50, p99 = weighted_quantile(samples, 0.5), weighted_quantile(samples, 0.99)
            line_rates[name] = records / window
            if lag <= 2 * rate:
                sustained[name] = max(sustained[name], rate)
            print(f"{rate:>8.0f} {name:>8} {records / window:>9,.0f} {size / window / mib:>7.2f} {lag:>9,} "
                  f"{p50 if p50 is not None else float('nan'):>7.2f} "
                  f"{p99 if p99 is not None else float('nan'):>7.2f}")
        ratio = line_rates["spark"] / line_rates["bare"] if line_rates["bare"] else float("nan")
        ratios.append(ratio)
        print(f"{'':>8} {'ratio':>8} {ratio:>9.2f}")
    print(f"highest rate with bounded lag: spark {sustained['spark']:.0f}/s, bare {sustained['bare']:.0f}/s")
    print(f"spark/bare records/s at the top step: {ratios[-1]:.2f} (median over steps "
          f"{statistics.median(ratios):.2f})")


def _print_batches(query: Any) -> None:
    """The query's recent batches with rows: their durations, rows and median phases."""
    batches = [item for item in query.recentProgress if item["numInputRows"]]
    if not batches:
        return
    durations = [item["durationMs"]["triggerExecution"] / 1000 for item in batches]
    rows = statistics.median(item["numInputRows"] for item in batches)
    print(f"spark batches with rows (last {len(batches)}): median {statistics.median(durations):.2f} s, "
          f"max {max(durations):.2f} s; median rows {rows:.0f}")
    phases = {phase: statistics.median(item["durationMs"].get(phase, 0) for item in batches)
              for phase in (*PHASES, "triggerExecution")}
    print("their median phases (ms): " + ", ".join(f"{name} {value:.0f}" for name, value in phases.items()))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="shardherd Spark pipeline vs bare boto3 on a fixed-rate stream")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--size", type=int, default=100, help="user record bytes")
    parser.add_argument("--kpl", action="store_true", help="KPL-aggregate the producer's records")
    parser.add_argument("--rates", default="1000,3000,6000", help="producer records/s, one step each")
    parser.add_argument("--step-seconds", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds of each step not measured")
    parser.add_argument("--cap", type=int, default=10_000, help="Kinesis records per shard per batch")
    parser.add_argument("--trigger", default="1 second")
    parser.add_argument("--timings", action="store_true",
                        help="log each batch's sink seconds (read + write, checkpoints) on stderr")
    return parser


def main() -> None:
    args = _parser().parse_args()
    if args.timings:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
        logging.getLogger("shardherd.agent.spark.commit").setLevel(logging.DEBUG)
    rates = [float(rate) for rate in args.rates.split(",")]
    context = mp.get_context("spawn")
    with local_stream_stack("bench-spark", args.shards, failover_millis=4000) as stack:
        endpoint = stack.base["kinesis_endpoint_url"]
        started = time.monotonic()
        spark = local_spark("shardherd-bench")
        spark.range(10).count()
        session_seconds = time.monotonic() - started
        agent = SparkAgent(stack.settings("bench-driver"), caps=Caps(args.cap), min_call_interval=0.0).start()
        stack.wait_owned("bench-driver")

        spark_tally, bare_tally = Tally(), Tally()
        first_write: list[float] = []
        halt = context.Event()
        reports = context.Queue()
        bare = context.Process(target=bare_consume, args=(endpoint, stack.app, reports, halt), daemon=True)
        bare.start()
        if reports.get(timeout=60)[0] != "ready":
            raise RuntimeError("bare consumer did not start")
        time.sleep(1.0)  # its LATEST iterators exist before the first record is put

        def drain_reports() -> None:
            while not halt.is_set():
                try:
                    at, records, size, samples = reports.get(timeout=0.2)
                except queue.Empty:
                    continue
                if at == "throttled":  # only behind the limits proxy, which this bench does not start
                    continue
                bare_tally.add(at, records, size, samples)

        threading.Thread(target=drain_reports, daemon=True).start()
        query_start = time.time()
        query = agent.run_query(spark, spark_sink(spark_tally, first_write), f"/tmp/{stack.app}-checkpoint",
                                processing_time=args.trigger)
        stack.produce(100, "warm-up")  # warm-up records: the steps start once the first batch was written
        while not first_write and query.isActive and time.time() < query_start + 300:
            time.sleep(0.1)
        begin = time.time() + 1.0
        steps = [(begin + index * args.step_seconds, rate) for index, rate in enumerate(rates)]
        steps.append((begin + len(rates) * args.step_seconds, 0.0))
        counts = context.Value("q", 0)
        producer = context.Process(target=produce, args=(endpoint, stack.app, args.size, args.kpl, steps, counts),
                                   daemon=True)
        producer.start()
        produced_at: list[tuple[float, int]] = []
        while time.time() < steps[-1][0] + 2:
            produced_at.append((time.time(), counts.value))
            time.sleep(0.25)

        def produced(until: float) -> int:
            return 100 + max((count for at, count in produced_at if at <= until), default=0)

        print(f"{args.shards} shards, {args.size} B records{', KPL-aggregated' if args.kpl else ''}; "
              f"trigger {args.trigger}, cap {args.cap}/shard/batch; steps of {args.step_seconds:.0f} s")
        print(f"start-up: Spark session {session_seconds:.1f} s; query start to first batch written "
              f"{(first_write[0] - query_start) if first_write else float('nan'):.1f} s (not in any figure below)")
        _print_steps(args, steps, produced, (spark_tally, bare_tally))
        _print_batches(query)
        if not first_write:
            print(f"no batch written; query active {query.isActive}, last progress {query.lastProgress}, "
                  f"exception {query.exception() if not query.isActive else None}")
        halt.set()
        query.stop()
        agent.stop(drain=False)
        producer.join(5)
        bare.join(5)
        spark.stop()


if __name__ == "__main__":
    main()
