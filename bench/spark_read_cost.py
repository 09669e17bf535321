"""What an executor read costs, and what the Spark pipeline reads per record written, against baselines of the run.

    python -m bench.spark_read_cost cpu --records 20000 --size 100 [--kpl]
    python -m bench.spark_read_cost pipeline --shards 4 --rate 400 --seconds 60 --trigger "1 second"

`cpu`: client-process CPU per record of three ways to read the same shard (median of `--repeat` reads):
  boto3:    GetRecords through boto3 as is (botocore parses every record: a datetime, a base64 decode) -> Record
            objects (KPL decode) -> one Python tuple per row (what `read()` yielded before the Arrow path);
  botocore: boto3 with the response parser's blob and timestamp parsers set to keep the raw JSON values
            (`set_parser_defaults`) -> `arrow_batch`: the SDK's signing, retries and endpoints, no per-record parse;
  raw:      `RawKinesis` (agent/spark/kinesis_raw.py: its own signed JSON calls, `json.loads` only) -> `arrow_batch`.
  With `--kpl` the raw path also runs with the pure-Python KPL decoder, so the decoder's share shows.

`pipeline`: a Spark driver (SparkAgent, local[2], a sink that collects each batch's arrival times: one action, so
every record is read once by it; with `--no-spark` the source's own code in a loop on the trigger's grid instead,
for a host too loaded for Spark's source runner to start) on a `--shards` stream with a producer at `--rate`
records/s, all Kinesis calls through bench/kinesis_counter.py. After a warm-up it counts `--seconds` and prints
payload read per payload written (the baseline: what the producer wrote in the same window), GetRecords calls per
shard per second (driver probes of Limit 1 and executor reads), the busiest shard-second, GetShardIterator calls
per shard per second, and the records' end-to-end latency (arrival at Kinesis to the end of the sink's action).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import boto3
import botocore.session

from shardherd.agent import kpl_decoding
from shardherd.agent.kpl import UserRecord, encode_aggregate
from shardherd.agent.records import DeaggregationCounters, records_from_kinesis
from shardherd.agent.spark.arrow_read import arrow_batch
from shardherd.agent.spark.kinesis_raw import RawKinesis
from tests.support.stream_stack import StreamStack, local_stream_stack

if TYPE_CHECKING:
    from bench.kinesis_counter import KinesisCounter

PER_AGGREGATE = 10


def boto3_path(stack: StreamStack, shard: str) -> int:
    client = stack.kinesis
    iterator = client.get_shard_iterator(StreamName=stack.app, ShardId=shard,
                                         ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    counters = DeaggregationCounters()
    rows = 0
    while iterator:
        response = client.get_records(ShardIterator=iterator, Limit=10_000)
        if not response["Records"]:
            break
        batch = [(record.shard_id, record.sequence_number, record.sub_sequence_number, record.partition_key,
                  record.approximate_arrival_timestamp, record.data)
                 for raw in response["Records"] for record in records_from_kinesis(shard, raw, counters)]
        rows += len(batch)
        iterator = response.get("NextShardIterator")
    return rows


def unparsed_client(endpoint_url: str) -> Any:
    """A boto3 Kinesis client whose responses keep `Data` as base64 text and timestamps as epoch seconds."""
    session = botocore.session.get_session()
    session.get_component("response_parser_factory").set_parser_defaults(
        blob_parser=lambda value: value, timestamp_parser=lambda value: value)
    return boto3.session.Session(botocore_session=session).client(
        "kinesis", region_name="us-east-1", endpoint_url=endpoint_url, aws_access_key_id="local",
        aws_secret_access_key="local")


def arrow_path(stack: StreamStack, shard: str, get_iterator: Callable[[], str],
               get_records: Callable[[str], dict[str, Any]]) -> int:
    iterator: str | None = get_iterator()
    rows = 0
    while iterator:
        response = get_records(iterator)
        if not response["Records"]:
            break
        rows += arrow_batch(stack.app, shard, response["Records"], False).num_rows
        iterator = response.get("NextShardIterator")
    return rows


def cpu(run: Callable[[], int], repeat: int) -> tuple[float, int]:
    samples = []
    rows = 0
    for _ in range(repeat):
        started = time.process_time()
        rows = run()
        samples.append(time.process_time() - started)
    return statistics.median(samples), rows


def fill(stack: StreamStack, records: int, size: int, kpl: bool) -> None:
    payload = b"x" * size
    for start in range(0, records, 500 * (PER_AGGREGATE if kpl else 1)):
        if kpl:
            entries = [{"Data": encode_aggregate([UserRecord("k", payload)] * PER_AGGREGATE), "PartitionKey": "k"}
                       for _ in range(min(500, (records - start) // PER_AGGREGATE))]
        else:
            entries = [{"Data": payload, "PartitionKey": f"k{index}"}
                       for index in range(start, min(records, start + 500))]
        stack.kinesis.put_records(StreamName=stack.app, Records=entries)


def cpu_main(args: argparse.Namespace) -> None:
    with local_stream_stack("bench-read", 1) as stack:
        shard = stack.kinesis.list_shards(StreamName=stack.app)["Shards"][0]["ShardId"]
        fill(stack, args.records, args.size, args.kpl)
        endpoint = stack.base["kinesis_endpoint_url"]
        raw = RawKinesis("us-east-1", endpoint)
        sdk = unparsed_client(endpoint)
        start = {"ShardIteratorType": "TRIM_HORIZON"}

        def raw_read() -> int:
            return arrow_path(stack, shard, lambda: raw.get_shard_iterator(stack.app, shard, start),
                              lambda iterator: raw.get_records(iterator, 10_000))

        def sdk_read() -> int:
            return arrow_path(stack, shard,
                              lambda: sdk.get_shard_iterator(StreamName=stack.app, ShardId=shard,
                                                             **start)["ShardIterator"],
                              lambda iterator: sdk.get_records(ShardIterator=iterator, Limit=10_000))

        old, old_rows = cpu(lambda: boto3_path(stack, shard), args.repeat)
        botocore_cpu, botocore_rows = cpu(sdk_read, args.repeat)
        new, new_rows = cpu(raw_read, args.repeat)
        assert old_rows == botocore_rows == new_rows
        print(f"{new_rows} rows of {args.size} B{' (KPL, 10 per aggregate)' if args.kpl else ''}, "
              f"median of {args.repeat} reads, client-process CPU only (KPL decoder: {kpl_decoding.decoder_name()})")
        print(f"boto3 as is, Record objects, tuples:     {old / old_rows * 1e6:6.2f} us/row")
        print(f"botocore, parser defaults, Arrow:        {botocore_cpu / botocore_rows * 1e6:6.2f} us/row   "
              f"{old / botocore_cpu:.1f}x less CPU than boto3 as is")
        print(f"raw JSON (kinesis_raw), Arrow:           {new / new_rows * 1e6:6.2f} us/row   "
              f"{old / new:.1f}x less CPU than boto3 as is, {botocore_cpu / new:.2f}x less than botocore")
        if args.kpl:
            chosen = kpl_decoding.decoder_name()
            kpl_decoding.use("python")
            pure, pure_rows = cpu(raw_read, args.repeat)
            kpl_decoding.use("auto")
            assert pure_rows == new_rows
            print(f"raw, pure-Python KPL decoder:            {pure / pure_rows * 1e6:6.2f} us/row   "
                  f"{chosen} takes {pure / new:.2f}x less CPU than it on this path")


class Producer(threading.Thread):
    """Puts `rate` records a second (100 B each) in 10 puts a second until stopped."""

    def __init__(self, client: Any, stream: str, rate: int) -> None:
        super().__init__(name="producer", daemon=True)
        self.client, self.stream, self.rate = client, stream, rate
        self.halt = threading.Event()

    def run(self) -> None:
        per_put = max(1, self.rate // 10)
        index = 0
        next_put = time.monotonic()
        while not self.halt.is_set():
            entries = [{"Data": b"p" * 100, "PartitionKey": f"k{index + offset}"} for offset in range(per_put)]
            self.client.put_records(StreamName=self.stream, Records=entries)
            index += per_put
            next_put += 0.1
            self.halt.wait(max(0.0, next_put - time.monotonic()))


def pipeline_main(args: argparse.Namespace) -> None:
    from bench.kinesis_counter import KinesisCounter
    from shardherd.agent.spark.driver import SparkAgent
    from shardherd.agent.spark.offsets import Caps
    from tests.support.stream_stack import local_spark

    latencies: list[float] = []
    batches: list[int] = []

    def sink(df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F  # noqa: N812

        arrivals = [row[0] for row in df.select(F.unix_micros("arrival_timestamp")).collect()]  # one action
        now = time.time()
        latencies.extend(now - micros / 1e6 for micros in arrivals)
        batches.append(len(arrivals))

    with local_stream_stack("bench-cost", args.shards, failover_millis=10_000) as stack, \
            KinesisCounter(stack.base["kinesis_endpoint_url"]) as counter:
        spark = local_spark("bench-spark-read-cost")
        producer = Producer(make_writer(counter.endpoint_url), stack.app, args.rate)
        agent: SparkAgent | None = None
        try:
            producer.start()
            for attempt in range(4):  # on a starved host the query's source runner may fail to start in time
                agent = SparkAgent(stack.settings(f"bench-driver-{attempt}", kinesis_endpoint_url=counter.endpoint_url),
                                   caps=Caps(10_000))
                query = agent.run_query(spark, sink, f"/tmp/bench-spark-read-cost-{time.time_ns()}",
                                        processing_time=args.trigger)
                deadline = time.monotonic() + 180
                while query.isActive and not batches and time.monotonic() < deadline:
                    time.sleep(0.5)
                if query.isActive:
                    break
                print(f"query failed to start ({str(query.exception()).splitlines()[0]}); again")
                agent.stop(drain=False)
            time.sleep(args.warmup)
            counter.reset()
            latencies.clear()
            batches.clear()
            time.sleep(args.seconds)
            report(counter, args, latencies, batches)
            assert query.isActive, f"the query ended during the bench: {query.exception()}"
        finally:
            producer.halt.set()
            if agent is not None:
                agent.stop(drain=False)
            spark.stop()


def loop_main(args: argparse.Namespace) -> None:
    """The pipeline's Kinesis calls without the JVM: the source's own planning, partitions and reads, in process.

    A starved host (load 40+ on 2 cores) can keep Spark's streaming source runner from connecting back to the JVM
    within its fixed 10 s, so no query starts. This loop runs the same code the runner and the executors run
    (`ShardherdStreamReader.latestOffset`, `partitions`, `read`) on the trigger's grid, and the agent's sink side
    (`begin_write`, `commit_progress`): every Kinesis call the pipeline makes, made by the same functions.
    """
    from bench.kinesis_counter import KinesisCounter
    from shardherd.agent.spark.driver import SparkAgent
    from shardherd.agent.spark.offsets import BatchOffset, Caps
    from shardherd.agent.spark.source import ShardherdStreamReader, SourceOptions

    trigger = float(args.trigger.split()[0])
    latencies: list[float] = []
    batches: list[int] = []
    with local_stream_stack("bench-cost", args.shards, failover_millis=10_000) as stack, \
            KinesisCounter(stack.base["kinesis_endpoint_url"]) as counter:
        agent = SparkAgent(stack.settings("bench-driver", kinesis_endpoint_url=counter.endpoint_url),
                           caps=Caps(10_000))
        agent.probe_schedule.trigger = trigger
        producer = Producer(make_writer(counter.endpoint_url), stack.app, args.rate)
        try:
            agent.start()
            deadline = time.monotonic() + 120
            while len(agent.book.held_shards()) < args.shards and time.monotonic() < deadline:
                time.sleep(0.2)
            producer.start()
            reader = ShardherdStreamReader(SourceOptions.parse(agent.source_options()))
            start = BatchOffset().to_json()
            began = time.monotonic()
            measuring = False
            while time.monotonic() - began < args.warmup + args.seconds:
                if not measuring and time.monotonic() - began >= args.warmup:
                    counter.reset()
                    latencies.clear()
                    batches.clear()
                    measuring = True
                time.sleep(trigger - time.time() % trigger)  # Spark's processing-time grid
                end = reader.latestOffset(start, reader.getDefaultReadLimit())
                if end == start:
                    continue
                arrivals = [value.timestamp() for part in reader.partitions(start, end) for batch in reader.read(part)
                            for value in batch.column("arrival_timestamp").to_pylist()]
                now = time.time()
                latencies.extend(now - arrival for arrival in arrivals)
                batches.append(len(arrivals))
                plans = agent.begin_write(list(BatchOffset.from_json(end).shards.values()))
                agent.commit_progress(len(batches), plans)
                start = end
            report(counter, args, latencies, batches)
        finally:
            producer.halt.set()
            agent.stop(drain=False)


def make_writer(endpoint_url: str) -> Any:
    return boto3.client("kinesis", region_name="us-east-1", endpoint_url=endpoint_url,
                        aws_access_key_id="local", aws_secret_access_key="local")


def report(counter: KinesisCounter, args: argparse.Namespace, latencies: list[float],
           batches: list[int]) -> None:
    written = counter.total("written bytes")
    per_shard_second = args.shards * args.seconds
    read_bytes = counter.total("read bytes") + counter.total("probe bytes")
    print(f"{args.shards} shards, {args.rate} records/s of 100 B, trigger {args.trigger}, {args.seconds} s window, "
          f"{len(batches)} batches")
    print(f"written: {counter.total('written records')} records, {written} payload bytes (the baseline)")
    print(f"payload read / written:        {read_bytes / max(1, written):.3f}   "
          f"(executor reads {counter.total('read bytes') / max(1, written):.3f}, "
          f"driver probes {counter.total('probe bytes') / max(1, written):.3f})")
    records = counter.total("read records") + counter.total("probe records")
    print(f"records read / written:        {records / max(1, counter.total('written records')):.3f}")
    calls = counter.total("read calls") + counter.total("probe calls")
    print(f"GetRecords per shard-second:   {calls / per_shard_second:.2f}   "
          f"(probes {counter.total('probe calls') / per_shard_second:.2f}, "
          f"executor reads {counter.total('read calls') / per_shard_second:.2f}); "
          f"busiest shard-second {counter.busiest_second()}")
    if batches:
        print(f"GetRecords per shard-batch:    {calls / (args.shards * len(batches)):.2f}   "
              f"(a batch every {args.seconds / len(batches):.2f} s on this host)")
    print(f"GetShardIterator per shard-s:  {counter.total('iterators') / per_shard_second:.3f}")
    if latencies:
        ordered = sorted(latencies)
        p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        print(f"e2e latency (arrival -> sink): p50 {p50:.2f} s, p99 {p99:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cpu_args = commands.add_parser("cpu", help="executor read CPU per record: boto3, botocore unparsed, raw")
    cpu_args.add_argument("--records", type=int, default=20_000)
    cpu_args.add_argument("--size", type=int, default=100)
    cpu_args.add_argument("--kpl", action="store_true")
    cpu_args.add_argument("--repeat", type=int, default=5)
    pipeline = commands.add_parser("pipeline", help="what the Spark pipeline reads per record written")
    pipeline.add_argument("--shards", type=int, default=4)
    pipeline.add_argument("--rate", type=int, default=400)
    pipeline.add_argument("--seconds", type=float, default=60)
    pipeline.add_argument("--warmup", type=float, default=15)
    pipeline.add_argument("--trigger", default="1 second")
    pipeline.add_argument("--no-spark", action="store_true", help="the source's code in a loop, without the JVM")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "cpu":
        cpu_main(args)
    elif args.no_spark:
        loop_main(args)
    else:
        pipeline_main(args)


if __name__ == "__main__":
    main()
