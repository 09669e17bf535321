"""Records/s and bytes/s delivered by ShardReader to a no-op consumer, against a bare boto3 GetRecords loop.

Starts kinesalite on 127.0.0.1 (kinesalite's GetRecords stays fast as shards grow; moto's does not), fills 4-8
shards with seeded random records through PutRecords, then reads every shard from TRIM_HORIZON to the tip, in turns:
a bare loop (GetShardIterator, then GetRecords Limit 10000 round-robin over the shards until each returns nothing),
and ShardReaders (de-aggregation check, Record objects, checkpoint tracking) stopping when caught up, their pacing
off: this bench measures the reader's own cost, and the bare loop is not paced either (on AWS both would be held to
the shard's limits; the reader's default pacing to half of them is decision 0029's, measured by bench/two_consumers).
Both use the same kind of boto3 client, in one thread. Rounds
alternate which goes first; medians are reported, with the ratio reader/bare (target at least 0.9). Absolute rates
measure the emulator as much as the reader: compare the ratio.
Run: `python -m bench.agent_read [--shards 6] [--records 10000] [--record-bytes 256] [--rounds 3] [--kpl]`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from shardherd.agent.kpl import Aggregator, UserRecord
from shardherd.agent.read_spec import ReadLimits, StartPosition
from shardherd.agent.reader import ShardReader
from shardherd.services.emulators.kinesalite import Kinesalite
from shardherd.services.emulators.ports import wait_until
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import TRIM_HORIZON

STREAM = "bench-agent-read"
PUT_BATCH = 500
Result = tuple[int, int, float]  # (records, bytes, seconds)


def fill(client: Any, shards: list[dict[str, Any]], per_shard: int, record_bytes: int, kpl: bool,
         seed: int = 7) -> None:
    """Put `per_shard` user records of `record_bytes` random bytes into each shard (as KPL aggregates with --kpl)."""
    rng = random.Random(seed)
    for shard in shards:
        hash_key = shard["HashKeyRange"]["StartingHashKey"]
        users = [UserRecord(f"pk-{i}", rng.randbytes(record_bytes)) for i in range(per_shard)]
        entries = (
            [{"Data": a.data, "PartitionKey": a.partition_key, "ExplicitHashKey": hash_key}
             for a in Aggregator().pack(users)]
            if kpl
            else [{"Data": u.data, "PartitionKey": u.partition_key, "ExplicitHashKey": hash_key} for u in users]
        )
        for start in range(0, len(entries), PUT_BATCH):
            response = client.put_records(StreamName=STREAM, Records=entries[start : start + PUT_BATCH])
            if response.get("FailedRecordCount"):
                raise RuntimeError(f"PutRecords failed for {response['FailedRecordCount']} records")


def bare_loop(client: Any, shard_ids: list[str]) -> Result:
    """The baseline: plain GetRecords round-robin over the shards until each returns no records."""
    started = time.perf_counter()
    iterators = {
        shard_id: client.get_shard_iterator(StreamName=STREAM, ShardId=shard_id,
                                            ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        for shard_id in shard_ids
    }
    records = size = 0
    while iterators:
        for shard_id, iterator in list(iterators.items()):
            response = client.get_records(ShardIterator=iterator, Limit=10_000)
            batch = response["Records"]
            records += len(batch)
            size += sum(len(item["Data"]) for item in batch)
            following = response.get("NextShardIterator")
            if batch and following:
                iterators[shard_id] = following
            else:
                del iterators[shard_id]
    return records, size, time.perf_counter() - started


def reader_loop(client: Any, shard_ids: list[str]) -> Result:
    """ShardReaders without pacing, round-robin, feeding a no-op consumer until each has caught up."""
    started = time.perf_counter()
    limits = ReadLimits(stop_when_caught_up=True, min_call_interval=0.0, read_bytes_per_second=1e12)
    readers = [ShardReader(client, STREAM, shard_id, StartPosition.after(TRIM_HORIZON), limits)
               for shard_id in shard_ids]
    records = size = 0
    while readers:
        for reader in list(readers):
            batch = reader.read_batch()
            records += len(batch.records)
            size += batch.data_bytes
            if reader.done:
                readers.remove(reader)
    return records, size, time.perf_counter() - started


def run(shard_count: int, per_shard: int, record_bytes: int, rounds: int, kpl: bool) -> None:
    """Start kinesalite, fill the stream, time both loops `rounds` times each and print the comparison."""
    with Kinesalite(shard_limit=shard_count + 10) as emulator:
        client = make_client("kinesis", "us-east-1", emulator.endpoint_url)
        client.create_stream(StreamName=STREAM, ShardCount=shard_count)
        wait_until(lambda: client.describe_stream_summary(StreamName=STREAM)["StreamDescriptionSummary"][
            "StreamStatus"] == "ACTIVE", 30.0, "stream ACTIVE", lambda: emulator.running)
        shards = client.list_shards(StreamName=STREAM)["Shards"]
        put_started = time.perf_counter()
        fill(client, shards, per_shard, record_bytes, kpl)
        put_seconds = time.perf_counter() - put_started
        print(f"kinesalite: {shard_count} shards x {per_shard} user records of {record_bytes} B"
              f"{' (KPL aggregated)' if kpl else ''}; filled in {put_seconds:.1f} s")
        shard_ids = [s["ShardId"] for s in shards]
        loops: dict[str, Callable[[Any, list[str]], Result]] = {"bare": bare_loop, "reader": reader_loop}
        results: dict[str, list[Result]] = {name: [] for name in loops}
        for round_index in range(rounds):
            order = list(loops) if round_index % 2 == 0 else list(reversed(loops))
            for name in order:
                results[name].append(loops[name](client, shard_ids))
        report(results, kpl)


def report(results: dict[str, list[Result]], kpl: bool) -> None:
    """Print median records/s and bytes/s per loop and the reader/bare ratios."""
    rates: dict[str, tuple[float, float]] = {}
    for name, runs in results.items():
        records_per_s = statistics.median(r / s for r, _, s in runs)
        bytes_per_s = statistics.median(b / s for _, b, s in runs)
        rates[name] = (records_per_s, bytes_per_s)
        seconds = ", ".join(f"{s:.2f}" for _, _, s in runs)
        unit = "Kinesis records" if kpl and name == "bare" else "user records"
        print(f"{name:>6}: {records_per_s:10,.0f} {unit}/s  {bytes_per_s / 2**20:7.2f} MiB/s  "
              f"({runs[0][0]} records per run; runs took {seconds} s)")
    if kpl:
        print(f"ratio reader/bare bytes/s {rates['reader'][1] / rates['bare'][1]:.3f} (user bytes against aggregate "
              "bytes: the cost of de-aggregation; the 0.9 target is for plain records)")
        return
    print(f"ratio reader/bare: records/s {rates['reader'][0] / rates['bare'][0]:.3f}, "
          f"bytes/s {rates['reader'][1] / rates['bare'][1]:.3f} (target >= 0.9)")


def main() -> None:
    """Parse arguments and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, default=6, choices=range(4, 9))
    parser.add_argument("--records", type=int, default=10_000, help="user records per shard")
    parser.add_argument("--record-bytes", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kpl", action="store_true", help="produce KPL aggregates (the ratio then compares "
                        "user records delivered with Kinesis records fetched)")
    args = parser.parse_args()
    run(args.shards, args.records, args.record_bytes, args.rounds, args.kpl)


if __name__ == "__main__":
    main()
