"""CPU per record of an executor's read, old path vs new, same records, same run (process CPU time, so a loaded
machine and the emulator's own work do not count).

    python -m bench.spark_read_cost --records 20000 --size 100 [--kpl]

old: boto3 GetRecords (botocore parses every record: datetime, base64) -> Record objects (pure-Python KPL decode)
     -> one Python tuple per row (what `read()` yielded before);
new: `RawKinesis` GetRecords (json.loads only) -> `arrow_batch`: one Arrow record batch per response.
With `--kpl`, the new path runs twice: with the process's KPL decoder (agent/kpl_decoding.py: the protobuf runtime's
C decoder when installed) and forced to the pure-Python decoder, so the decoder's share is measured in the same run.
Each path reads the whole shard from TRIM_HORIZON `--repeat` times; the median is reported.
"""

from __future__ import annotations

import argparse
import statistics
import time

from shardherd.agent import kpl_decoding
from shardherd.agent.kpl import UserRecord, encode_aggregate
from shardherd.agent.records import DeaggregationCounters, records_from_kinesis
from shardherd.agent.spark.arrow_read import arrow_batch
from shardherd.agent.spark.kinesis_raw import RawKinesis
from tests.support.stream_stack import StreamStack, local_stream_stack

PER_AGGREGATE = 10


def old_path(stack: StreamStack, shard: str) -> int:
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


def new_path(stack: StreamStack, raw: RawKinesis, shard: str) -> int:
    iterator: str | None = raw.get_shard_iterator(stack.app, shard, {"ShardIteratorType": "TRIM_HORIZON"})
    rows = 0
    while iterator:
        response = raw.get_records(iterator, 10_000)
        if not response["Records"]:
            break
        rows += arrow_batch(stack.app, shard, response["Records"], False).num_rows
        iterator = response.get("NextShardIterator")
    return rows


def cpu(run: object, repeat: int) -> tuple[float, int]:
    samples = []
    rows = 0
    for _ in range(repeat):
        started = time.process_time()
        rows = run()  # type: ignore[operator]
        samples.append(time.process_time() - started)
    return statistics.median(samples), rows


def main() -> None:
    parser = argparse.ArgumentParser(description="executor read CPU per record, old vs new")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--kpl", action="store_true")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with local_stream_stack("bench-read", 1) as stack:
        shard = stack.kinesis.list_shards(StreamName=stack.app)["Shards"][0]["ShardId"]
        payload = b"x" * args.size
        for start in range(0, args.records, 500 * (PER_AGGREGATE if args.kpl else 1)):
            if args.kpl:
                entries = [{"Data": encode_aggregate([UserRecord("k", payload)] * PER_AGGREGATE), "PartitionKey": "k"}
                           for _ in range(min(500, (args.records - start) // PER_AGGREGATE))]
            else:
                entries = [{"Data": payload, "PartitionKey": f"k{index}"}
                           for index in range(start, min(args.records, start + 500))]
            stack.kinesis.put_records(StreamName=stack.app, Records=entries)
        raw = RawKinesis("us-east-1", stack.base["kinesis_endpoint_url"])
        old, old_rows = cpu(lambda: old_path(stack, shard), args.repeat)
        new, new_rows = cpu(lambda: new_path(stack, raw, shard), args.repeat)
        print(f"{old_rows} rows of {args.size} B{' (KPL, 10 per aggregate)' if args.kpl else ''}, "
              f"median of {args.repeat} reads, client-process CPU only")
        print(f"old (boto3 parse, Record objects, tuples): {old / old_rows * 1e6:6.2f} us/row")
        print(f"new (raw JSON, Arrow columns):             {new / new_rows * 1e6:6.2f} us/row   "
              f"{old / new:.1f}x less CPU   (KPL decoder: {kpl_decoding.decoder_name()})")
        if args.kpl:
            chosen = kpl_decoding.decoder_name()
            kpl_decoding.use("python")
            pure, pure_rows = cpu(lambda: new_path(stack, raw, shard), args.repeat)
            kpl_decoding.use("auto")
            assert pure_rows == new_rows
            print(f"new, pure-Python KPL decoder:              {pure / pure_rows * 1e6:6.2f} us/row   "
                  f"{chosen} takes {pure / new:.2f}x less CPU than it on this path")


if __name__ == "__main__":
    main()
