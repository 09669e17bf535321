"""A hot shard's backlog read as an agent reads it, while every other shard is polled: the scale run's timeouts.

Starts kinesalite and the limits proxy on 127.0.0.1, a stream of `--shards` shards with `--backlog` records on one
(30 % of them ten times larger, as the stack's KPL aggregates), then for `--seconds`: `--processes` processes poll
every other shard once a second through the proxy (as idle agents do), the stack's producer puts `--rate` records/s,
and the hot shard is read from TRIM_HORIZON with the agents' deadline (5 s) and ask (Limit 10,000, 100 after a
timeout, doubled after each answer). Prints the pollers' latency and failures, the hot reader's timeouts and records,
kinesalite's and the proxy's CPU, and the host's load (docs/decisions/0029-kinesis-limits-model.md, session 27).
Run: `python -m bench.hot_shard_read [--shards 256] [--processes 4] [--backlog 30000] [--rate 300] [--seconds 60]`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import threading
import time
from typing import Any

import psutil
from botocore.exceptions import ReadTimeoutError

from shardherd.agent.read_deadline import READ_FLOOR
from shardherd.agent.read_spec import MAX_RECORDS_PER_CALL
from shardherd.agent.reader import MIN_RECORDS_PER_CALL
from shardherd.services.emulators.kinesalite import Kinesalite
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.local_stack.producer import Producer, ZipfKeys
from shardherd.shared.aws import make_client
from tests.support.stream_stack import active_stream

STREAM = "bench-hot-shard"
TIMEOUTS = (READ_FLOOR / 2, READ_FLOOR)  # the agents' (connect, read) deadline at the default failover time


def _poll_shard(kinesis: Any, shard: str, until: float, results: list[float | None]) -> None:
    iterator = kinesis.get_shard_iterator(StreamName=STREAM, ShardId=shard, ShardIteratorType="LATEST")["ShardIterator"]
    time.sleep(random.random())
    while time.monotonic() < until:
        started = time.perf_counter()
        try:
            iterator = kinesis.get_records(ShardIterator=iterator, Limit=MAX_RECORDS_PER_CALL)["NextShardIterator"]
            results.append(time.perf_counter() - started)
        except Exception:  # a failed call is counted (None) and the shard polled again
            results.append(None)
        time.sleep(1.0)


def _pollers(endpoint: str, shards: list[str], seconds: float, out: Any) -> None:
    """Poll each of `shards` once a second for `seconds`, on one client (an agent's); put the latencies on `out`."""
    kinesis = make_client("kinesis", "us-east-1", endpoint, timeouts=TIMEOUTS)
    until, results = time.monotonic() + seconds, list[float | None]()
    threads = [threading.Thread(target=_poll_shard, args=(kinesis, shard, until, results)) for shard in shards]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put(results)


def _read_hot(kinesis: Any, shard: str, seconds: float) -> tuple[int, int, int]:
    """Read `shard` as an agent asks (agent/reader.py); (records read, calls answered, calls timed out)."""
    iterator = kinesis.get_shard_iterator(StreamName=STREAM, ShardId=shard,
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    ask, records, answered, timeouts = MAX_RECORDS_PER_CALL, 0, 0, 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            answer = kinesis.get_records(ShardIterator=iterator, Limit=ask)
        except ReadTimeoutError:
            timeouts, ask = timeouts + 1, MIN_RECORDS_PER_CALL
            continue
        iterator, answered = answer["NextShardIterator"], answered + 1
        records += len(answer["Records"])
        ask = min(MAX_RECORDS_PER_CALL, 2 * ask)
        time.sleep(0.4 if answer["Records"] else 1.0)
    return records, answered, timeouts


def _fill(kinesis: Any, shard: dict[str, Any], backlog: int) -> None:
    small = json.dumps({"n": 0, "key": "key-0000", "t": time.time()}).encode()
    hash_key = str(int(shard["HashKeyRange"]["StartingHashKey"]) + 1)
    for start in range(0, backlog, 500):
        kinesis.put_records(StreamName=STREAM, Records=[
            {"Data": small * 10 if index % 10 < 3 else small, "PartitionKey": "key-0000", "ExplicitHashKey": hash_key}
            for index in range(start, min(start + 500, backlog))])


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def main() -> None:
    """Run the load and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, default=256)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--backlog", type=int, default=30_000)
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    with Kinesalite(shard_limit=2 * args.shards) as kinesalite, KinesisLimits(kinesalite.port) as limits:
        direct = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
        active_stream(direct, STREAM, args.shards)
        shards = direct.list_shards(StreamName=STREAM)["Shards"]
        hot = shards[len(shards) // 2]
        _fill(direct, hot, args.backlog)
        others = [shard["ShardId"] for shard in shards if shard is not hot]
        rng = random.Random(7)
        producer = Producer(make_client("kinesis", "us-east-1", limits.endpoint_url), STREAM, args.rate, 0.3,
                            ZipfKeys(1000, 1.2, rng), rng)
        spawn = multiprocessing.get_context("spawn")
        out = spawn.Queue()
        pollers = [spawn.Process(target=_pollers, args=(limits.endpoint_url, others[index::args.processes],
                                                        args.seconds, out)) for index in range(args.processes)]
        for poller in pollers:
            poller.start()
        producer.start()
        time.sleep(5.0)
        emulator, proxy = psutil.Process(kinesalite.pid), psutil.Process(limits.pid)
        cpu_before, started = (_cpu(emulator), _cpu(proxy)), time.monotonic()
        hot_client = make_client("kinesis", "us-east-1", limits.endpoint_url, timeouts=TIMEOUTS)
        records, answered, timeouts = _read_hot(hot_client, hot["ShardId"], args.seconds - 10)
        elapsed = time.monotonic() - started
        cpu = ((_cpu(emulator) - cpu_before[0]) / elapsed, (_cpu(proxy) - cpu_before[1]) / elapsed)
        load = os.getloadavg()[0]
        producer.stop()
        results = [latency for _ in pollers for latency in out.get()]
        for poller in pollers:
            poller.join()
    answers = sorted(latency for latency in results if latency is not None)
    failed = len(results) - len(answers)
    print(f"{args.shards} shards, {args.processes} polling processes, producer {args.rate:g} records/s, "
          f"load {load:.1f}; kinesalite {cpu[0] * 100:.0f} % of a core, the proxy {cpu[1] * 100:.0f} %")
    if answers:
        print(f"pollers: {len(answers)} answered, {failed} failed; p50 {answers[len(answers) // 2] * 1000:.0f} ms, "
              f"p99 {answers[int(len(answers) * 0.99)] * 1000:.0f} ms")
    print(f"hot shard ({args.backlog:,} records behind): {records:,} read in {answered} answers, {timeouts} timeouts")


if __name__ == "__main__":
    main()
