"""Where a leader's full run spends its time on a PostgreSQL lease table, on a quiet host and on a busy one.

    python -m bench.leader_run [--shards 256] [--agents 32] [--busy 0,16] [--seconds 120] [--store postgres]

The scale run (bench/scale.py: 256 shards, 32 agents, every process real, load 16-25 on two cores) measured full
runs at p50 134 ms and p99 1.6 s; this bench reproduces the leader's side of it cheaply. The fleet simulator's fleet
(bench/fleet/: the real leader loop, lock and decider; simulated agents running the agent's lease keeper,
heartbeating with CPU metrics, reporting per-lease progress, checkpointing once a minute, on the coordinator channel)
runs on a throwaway PostgreSQL (tests/support/postgres.py, at the scale run's raised priority) instead of its
in-memory store, with the scale run's user defaults (bench/stack_cost.py). Its clock is virtual, the leader's work
and store calls are real: each run's parts (RunLaps: wall milliseconds) and its thread's CPU time are what the live
leader would spend on them. The simulated agents act between the leader's runs, in the same thread.

For each `--busy` count it starts that many busy loops (separate processes at the default priority, as the scale
run's 30+ Python processes) and, once every lease is owned, prints over `--seconds` virtual seconds of full runs:
wall and CPU p50/p99/max and each part's, with the load average. `--store memory` runs on the in-memory store (the
leader's own CPU alone); `--favour` runs the leader at the services' priority (a coordinator with a CPU share of its
own).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from bench.fleet.model import VARIANCE, Fleet
from bench.fleet.world import Stream
from bench.scale import percentiles
from bench.scale_sim import user_settings
from bench.stack_cost import favour
from shardherd.coordinator.run_summary import FULL_RUN_PARTS, RunSummary
from shardherd.shared.config import load_settings
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_factory import open_store
from tests.support.postgres import PostgresServer

SPIN = "while True: pass"


@contextmanager
def busy(count: int) -> Iterator[None]:
    """`count` processes spinning on a core each (the host's other work), stopped on exit."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait(10)


def _store(postgres: PostgresServer | None) -> LeaseStore | None:
    """The fleet's tables on `postgres`, at the scale run's priority (None without: the fleet's in-memory store)."""
    if postgres is None:
        return None
    favour([postgres.pid])
    settings = load_settings(application_name="fleet-sim", store_backend="sql", sql_url=postgres.url)
    store = open_store(settings, caller="coordinator")
    store.ensure_tables()
    return store


def runs(shards: int, agents: int, seconds: float, store: LeaseStore | None, seed: int = 7) -> list[RunSummary]:
    """The full runs of `seconds` virtual seconds once every lease of the fleet is owned."""
    rng = random.Random(seed)
    full: list[RunSummary] = []
    stream = Stream.tiled([rng.uniform(0.5, 4.0) for _ in range(shards)])
    fleet = Fleet(VARIANCE, "worker", stream, seed, checkpoint_seconds=60.0, overrides=user_settings(),
                  base_store=store, progress=True, channel=True,
                  on_run=lambda summary: full.append(summary) if summary.scanned and summary.ok else None)
    fleet.calibrate(agents)
    fleet.add_workers(agents)
    while fleet.events.now() < 300.0 and not all(lease.actual_owner for lease in fleet.leases()):
        fleet.events.run_until(fleet.events.now() + 1.0)
    fleet.events.run_until(fleet.events.now() + 20.0)  # the first balancing runs
    full.clear()
    fleet.events.run_until(fleet.events.now() + seconds)
    return full


def wall(summary: RunSummary) -> float:
    """A full run's wall milliseconds: its parts' sum (its duration is on the fleet's virtual clock)."""
    return summary.scan_ms + summary.decide_ms + sum(summary.parts.values())


def report(summaries: Sequence[RunSummary]) -> str:
    """Wall, CPU and each part's time of the full runs, one line each."""
    lines = [f"  wall: {percentiles([wall(s) for s in summaries])}",
             f"  CPU of the run's thread: {percentiles([s.cpu_ms for s in summaries])}"]
    for part in FULL_RUN_PARTS:
        values = [s.scan_ms if part == "scan" else s.decide_ms if part == "decide" else s.parts.get(part, 0.0)
                  for s in summaries]
        lines.append(f"  {part}: {percentiles(values)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure each busy count in turn on a fresh store."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, default=256)
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--busy", default="0,16", help="comma-separated counts of busy loops to measure under")
    parser.add_argument("--seconds", type=float, default=120.0, help="virtual seconds of full runs measured")
    parser.add_argument("--store", choices=("postgres", "memory"), default="postgres")
    parser.add_argument("--favour", action="store_true", help="run the leader (this process) at the priority the "
                        "scale run gives the services (bench/stack_cost.py `favour`): a coordinator with a CPU share "
                        "of its own, as a pod with a CPU request has")
    args = parser.parse_args(argv)
    if args.favour:
        favour([os.getpid()])
    for count in (int(value) for value in args.busy.split(",") if value):
        postgres = PostgresServer().start() if args.store == "postgres" else None
        store = _store(postgres)
        try:
            with busy(count):
                summaries = runs(args.shards, args.agents, args.seconds, store)
                load = os.getloadavg()
        finally:
            if store is not None:
                store.close()
            if postgres is not None:
                postgres.stop()
        print(f"{args.shards} shards, {args.agents} agents, store {args.store}, {count} busy loops, leader "
              f"{'favoured' if args.favour else 'at the default priority'} "
              f"(load {load[0]:.1f} {load[1]:.1f}): {len(summaries)} full runs", flush=True)
        print(report(summaries), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
