"""Two shardherd applications beside each other on one stream, through the Kinesis limits proxy.

Starts moto server, kinesalite and the limits proxy (services/emulators/limits_proxy.py) on 127.0.0.1, then two
applications (a coordinator and one plain agent each, own lease tables) on one stream written at `--rate` records/s
of `--size` bytes per shard (default: half of a shard's write limits). Runs twice in the same process: the reads'
old pacing (a call 0.2 s after any call that returned records, as before decision 0029) as the baseline, then the
defaults. Prints per application GetRecords calls per shard per second and the drain time after the producer stopped,
the proxy's throttled share of GetRecords calls, and the ratios new/old.
With `--spark`, application "a" is the Spark pipeline (a Spark driver's agent with user defaults, local[2], 1 s
trigger) beside the plain application "b", both with user defaults, run once: it prints the same figures and the
Spark batches' timing (tests/support/two_consumers.py): longest gap between two, longest batch, longest delay of a
batch past when Spark could start it (above one trigger, a batch was delayed by more than one trigger).
Run: `python -m bench.two_consumers [--shards 1] [--rate 500] [--size 1000] [--seconds 20] [--spark]`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from shardherd.agent.read_spec import ReadLimits
from shardherd.services.emulators.kinesalite import Kinesalite
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.moto_server import MotoServer
from tests.support.two_consumers import BatchTiming, TwoConsumers, run_two_consumers

OLD_PACING = ReadLimits(min_call_interval=0.2, idle_backoff=0.2, read_bytes_per_second=1e12)


def _line(label: str, run: TwoConsumers) -> str:
    apps = "  ".join(f"{name}: {app.calls_per_shard_second:.2f} calls/shard/s, drain {app.drain_seconds:.1f} s, "
                     f"throttled {app.throttled}" for name, app in sorted(run.apps.items()))
    return (f"{label:<9} written {run.written / run.seconds:7.1f} rec/s  {apps}  proxy: GetRecords "
            f"{run.proxy_calls}, throttled {run.proxy_throttled} ({100 * run.throttled_fraction:.2f} %), "
            f"write throttled {run.write_throttled}, GetShardIterator {run.iterators}"
            + _batches(run.spark_batches))


def _batches(timing: BatchTiming | None) -> str:
    if timing is None:
        return ""
    return (f"  spark batches: gap max {timing.gap_max:.2f} s, longest {timing.longest:.2f} s, "
            f"delay max {timing.delay_max:.2f} s")


def spark_main(args: argparse.Namespace) -> None:
    """The Spark pipeline beside a plain application, user defaults, once; the load average with the figures."""
    from tests.support.stream_stack import local_spark

    spark = local_spark("bench-two-consumers")
    try:
        with MotoServer() as moto, Kinesalite(shard_limit=500) as kinesalite, \
                KinesisLimits(kinesalite.port) as limits, tempfile.TemporaryDirectory() as workdir:
            run = run_two_consumers(moto, limits, args.shards, args.rate * args.shards, args.size, args.seconds,
                                    spark=spark, workdir=Path(workdir), failover_millis=10_000)
    finally:
        spark.stop()
    print(f"{args.shards} shard(s), {args.rate:.0f} records/s of {args.size} B per shard, {args.seconds:.0f} s; "
          f"a = Spark pipeline, b = plain application; load average {os.getloadavg()[0]:.1f}")
    print(_line("spark+b", run))


def main() -> None:
    """Run the old pacing, then the defaults, and print both and their ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--rate", type=float, default=500.0, help="records/s per shard")
    parser.add_argument("--size", type=int, default=1000, help="bytes per record")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--spark", action="store_true", help="application a is the Spark pipeline; run once")
    args = parser.parse_args()
    if args.spark:
        spark_main(args)
        return
    with MotoServer() as moto, Kinesalite(shard_limit=500) as kinesalite, KinesisLimits(kinesalite.port) as limits:
        runs = {label: run_two_consumers(moto, limits, args.shards, args.rate * args.shards, args.size,
                                         args.seconds, read_limits)
                for label, read_limits in (("old", OLD_PACING), ("new", None))}
    for label, run in runs.items():
        print(_line(label, run))
    old, new = runs["old"], runs["new"]
    for name in sorted(new.apps):
        ratio = new.apps[name].calls_per_shard_second / max(1e-9, old.apps[name].calls_per_shard_second)
        print(f"application {name}: GetRecords calls per shard per second new/old = {ratio:.2f}")
    print(f"throttled share of GetRecords calls: old {100 * old.throttled_fraction:.2f} %, "
          f"new {100 * new.throttled_fraction:.2f} %")


if __name__ == "__main__":
    main()
