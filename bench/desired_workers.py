"""The desired-worker count (`GET /v1/scale`) over a load past the fleet's capacity and back, in the live stack.

    python -m bench.desired_workers [--hot 3] [--hot-rate 600] [--hot-seconds 180] [--after 600] [--cap 30]
                                    [--every-reading]

One plain stack (`shardherd up --no-spark`, 8 shards, 3 agents, 200 records/s, CPU metrics on, the scale windows at
their defaults: 1 min out, 5 min in) with `max_throughput_per_host_kbps` set to `--cap`. On this 2-core host a
worker's CPU-based capacity (70 % of the host per agent) is far above what the emulators can carry, so the count would
never move; the cap, a user setting (KCL's `maxThroughputPerHostKBps`), bounds each worker's capacity instead. After
`--warmup` s, `--hot` shards get `--hot-rate` extra records/s each (past 3 workers' capacity at the cap) for
`--hot-seconds`, then the extra load ends and the bench watches `--after` s more. `/v1/scale` is read every `--poll`
s throughout.

Prints every change of the published count (seconds from the load's start or end, count, load, capacity, reason;
with `--every-reading` every reading, to see how the asks ramp with the throughput averages), then: seconds from the
load's start to the first rise, from its end to the first fall, and the number of changes in each direction (the
issue's targets: a rise within 2 minutes, a fall within 10, one change per direction), with the load average (the
machine is shared).
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.churn import StackRun, _poll
from shardherd.services.local_stack.control import request
from shardherd.services.status_cli import ApiError, OperatorClient


@dataclass(frozen=True)
class Reading:
    """One answer of `/v1/scale`, with the bench's wall clock."""

    at: float
    desired: int
    current: int
    load: float
    capacity: float | None
    reason: str


def read_scale(client: OperatorClient) -> Reading | None:
    """The published count now, or None while no replica answers one (before the first publication, a loaded host)."""
    try:
        body: dict[str, Any] = client.call("GET", "/v1/scale")
    except ApiError:
        return None
    return Reading(time.time(), body["desired_workers"], body["current_workers"], body["load_kbps"],
                   body["capacity_kbps"], "; ".join(body["reasons"]))


def watch(client: OperatorClient, seconds: float, poll: float, readings: list[Reading]) -> None:
    """Append a reading every `poll` s for `seconds` s."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        reading = read_scale(client)
        if reading is not None:
            readings.append(reading)
        time.sleep(poll)


def change_lines(readings: Sequence[Reading], hot_start: float, hot_end: float) -> list[str]:
    """One line per change of the count: when (from the load's start or end), the count, the load, the capacity."""
    return [_line(change, hot_start, hot_end) for before, change in itertools.pairwise(readings)
            if change.desired != before.desired]


def reading_lines(readings: Sequence[Reading], hot_start: float, hot_end: float) -> list[str]:
    """One line per reading (`--every-reading`): how the asks ramp with the throughput averages."""
    return [_line(reading, hot_start, hot_end) for reading in readings]


def _line(reading: Reading, hot_start: float, hot_end: float) -> str:
    since = (f"+{reading.at - hot_start:.0f} s after the load began" if reading.at < hot_end
             else f"+{reading.at - hot_end:.0f} s after it ended")
    capacity = "none" if reading.capacity is None else f"{reading.capacity:.1f}"
    return (f"  {since}: desired {reading.desired} (current {reading.current}), load {reading.load:.1f} KiB/s, "
            f"capacity {capacity} KiB/s per worker; {reading.reason}")


def summary_lines(readings: Sequence[Reading], hot_start: float, hot_end: float) -> list[str]:
    """The count before the load and at its peak, the rise and fall times, and the changes per direction."""
    before = [r.desired for r in readings if r.at < hot_start]
    ups = [c for a, c in itertools.pairwise(readings) if c.desired > a.desired]
    downs = [c for a, c in itertools.pairwise(readings) if c.desired < a.desired]
    rise = next((c.at - hot_start for c in ups if c.at >= hot_start), None)
    fall = next((c.at - hot_end for c in downs if c.at >= hot_end), None)
    peak = max((r.desired for r in readings), default=None)
    return [f"count before the load {before[-1] if before else None}, peak {peak}, "
            f"last {readings[-1].desired if readings else None}",
            f"rise: {_seconds(rise, 'after the load began (target <= 120 s)')}",
            f"fall: {_seconds(fall, 'after the load ended (target <= 600 s)')}",
            f"changes: {len(ups)} up, {len(downs)} down (target: one per direction); {len(readings)} readings"]


def _seconds(value: float | None, what: str) -> str:
    return "none" if value is None else f"{value:.0f} s {what}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stack through the load and print the count's course."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--cap", type=float, default=30.0, help="max_throughput_per_host_kbps (KiB/s per worker)")
    parser.add_argument("--hot", type=int, default=3, help="shards that get the extra load")
    parser.add_argument("--hot-rate", type=float, default=600.0, help="extra records/s per hot shard")
    parser.add_argument("--hot-seconds", type=float, default=180.0)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--after", type=float, default=600.0, help="seconds watched after the load ends")
    parser.add_argument("--poll", type=float, default=5.0)
    parser.add_argument("--run-root", default=None, help="where the stack's run directory goes (default: a temp dir)")
    parser.add_argument("--every-reading", action="store_true", help="print every reading, not only changes")
    args = parser.parse_args(argv)
    root = Path(args.run_root or tempfile.mkdtemp(prefix="desired-"))
    duration = args.warmup + args.hot_seconds + args.after + 300
    stack = StackRun(root / "run", False, {"max_throughput_per_host_kbps": str(args.cap)},
                     ["--shards", str(args.shards), "--agents", str(args.agents), "--rate", str(args.rate),
                      "--duration", str(duration)])
    readings: list[Reading] = []
    try:
        state = stack.wait_ready(args.shards)
        client = OperatorClient(state.api_urls(), token=state.api_token(), timeout=30.0)
        print(f"every shard owned {stack.all_assigned:.1f} s after the command; warm-up {args.warmup:.0f} s",
              flush=True)
        watch(client, args.warmup, args.poll, readings)
        leases = sorted(_poll(state.api_urls(), state.api_token()) or {})
        hot = leases[: args.hot]
        hot_start = time.time()
        for shard in hot:
            request(state.control_socket, "hot-shard", shard=shard, rate=args.hot_rate)
        print(f"{', '.join(hot)}: +{args.hot_rate:.0f} records/s each for {args.hot_seconds:.0f} s "
              f"(load average {os.getloadavg()[0]:.1f})", flush=True)
        watch(client, args.hot_seconds, args.poll, readings)
        for shard in hot:
            request(state.control_socket, "hot-shard", shard=shard, rate=0.0)
        hot_end = time.time()
        print(f"extra load ended (load average {os.getloadavg()[0]:.1f}); watching {args.after:.0f} s", flush=True)
        watch(client, args.after, args.poll, readings)
    finally:
        stack.stop()
    shown = reading_lines(readings, hot_start, hot_end) if args.every_reading else change_lines(readings, hot_start,
                                                                                               hot_end)
    for line in shown + summary_lines(readings, hot_start, hot_end):
        print(line)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
