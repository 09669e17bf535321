"""The Kinesis limits proxy's overhead: call latency through it against kinesalite directly, in the same run.

Starts kinesalite and the proxy (services/emulators/limits_proxy.py) on 127.0.0.1, creates a stream with limits
left unreached (PutRecords of `--batch` records of `--size` bytes spread over `--shards` shards; GetRecords of up to
`--batch` records, one shard at a time within its 5 calls/s), and times the same calls in alternating rounds, direct
and through the proxy. Prints the median milliseconds per call of each and the ratio proxy/direct, per operation,
and the proxy process's own CPU time per call it served (latency on a loaded machine is mostly kinesalite's noise;
the CPU time is what the proxy adds to a 2-core stack).
Run: `python -m bench.limits_proxy [--rounds 5] [--calls 20] [--batch 100] [--size 1000] [--shards 4]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psutil

from shardherd.services.emulators.kinesalite import Kinesalite
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.shared.aws import make_client

STREAM = "bench-limits-proxy"


def _put(client: Any, calls: int, batch: int, size: int) -> float:
    started = time.perf_counter()
    for call in range(calls):
        records = [{"Data": b"x" * size, "PartitionKey": f"{call}-{index}"} for index in range(batch)]
        client.put_records(StreamName=STREAM, Records=records)
    return (time.perf_counter() - started) / calls * 1000


def _get(client: Any, calls: int, batch: int, shards: list[str]) -> float:
    iterators = {shard: client.get_shard_iterator(StreamName=STREAM, ShardId=shard,
                                                  ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
                 for shard in shards}
    elapsed = 0.0
    for call in range(calls):
        shard = shards[call % len(shards)]
        started = time.perf_counter()
        answer = client.get_records(ShardIterator=iterators[shard], Limit=batch)
        elapsed += time.perf_counter() - started
        iterators[shard] = answer["NextShardIterator"]
        time.sleep(0.25 / len(shards))  # within 5 calls per second per shard, not timed
    return elapsed / calls * 1000


def main() -> None:
    """Time PutRecords and GetRecords direct and through the proxy, alternating rounds; print medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=4)
    args = parser.parse_args()
    with Kinesalite(shard_limit=500) as kinesalite, KinesisLimits(kinesalite.port) as limits:
        direct = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
        proxied = make_client("kinesis", "us-east-1", limits.endpoint_url)
        direct.create_stream(StreamName=STREAM, ShardCount=args.shards)
        while direct.describe_stream_summary(StreamName=STREAM)["StreamDescriptionSummary"]["StreamStatus"] \
                != "ACTIVE":
            time.sleep(0.05)
        shards = [shard["ShardId"] for shard in direct.list_shards(StreamName=STREAM)["Shards"]]
        proxy = psutil.Process(limits.pid)
        cpu_before = sum(proxy.cpu_times()[:2])
        times: dict[tuple[str, str], list[float]] = {}
        for round_ in range(args.rounds):
            order = [("direct", direct), ("proxy", proxied)]
            for label, client in order if round_ % 2 == 0 else order[::-1]:
                times.setdefault(("PutRecords", label), []).append(_put(client, args.calls, args.batch, args.size))
                times.setdefault(("GetRecords", label), []).append(_get(client, args.calls, args.batch, shards))
                time.sleep(1.0)  # the writes' 1 s window empties between rounds
        cpu_ms = (sum(proxy.cpu_times()[:2]) - cpu_before) * 1000
        proxied_calls = args.rounds * args.calls * 2 + args.rounds * len(shards)  # puts, gets and iterators
    for operation in ("PutRecords", "GetRecords"):
        direct_ms = statistics.median(times[(operation, "direct")])
        proxy_ms = statistics.median(times[(operation, "proxy")])
        print(f"{operation:<10} direct {direct_ms:7.2f} ms/call  proxy {proxy_ms:7.2f} ms/call  "
              f"ratio proxy/direct {proxy_ms / direct_ms:.2f}  (+{proxy_ms - direct_ms:.2f} ms)")
    print(f"proxy CPU: {cpu_ms / proxied_calls:.2f} ms per call served ({proxied_calls} calls, "
          f"{args.batch} records of {args.size} B per put or get)")


if __name__ == "__main__":
    main()
