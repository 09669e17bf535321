"""One plain agent's start-up time and resident memory, per store, against a bare boto3 process in the same run.

    python -m bench.agent_footprint [--stores moto,postgres,sqlite] [--shards 8] [--read 10] [--rate 40]

The agent is the process `shardherd up --no-spark` starts for each of its agents (LocalStack.add_agent: `python -m
shardherd agent --processor ...CountingProcessor` under the stack's parent watcher), started into a running stack
(the stack's emulators, one coordinator process, its producer at `--rate` records/s) with the scale run's user
defaults (CPU metrics on, bench/stack_cost.py's USER_DEFAULTS) and store meter. For each store it prints:
* exec to the agent's first worker row (its first heartbeat; decision 0038 delays that by the first CPU report, 2 s,
  plus up to 1 s of jitter) and the CPU seconds the process had used by then (what 32 agents starting on two cores
  wait for);
* its resident memory (max over `--read` s) once it holds every one of the stream's `--shards` leases and reads
  them, of which the part no other process shares (USS: what each further agent on the host adds; the rest is
  mostly the interpreter's, OpenSSL's and the extension modules' code, mapped once for every agent), and the share
  of a core it uses meanwhile;
* the same figures of a bare `python -c 'import boto3; boto3.client("kinesis", ...)'` process that makes one Kinesis
  call (exec to its answer, its resident memory), and the ratios against it: the machine is shared and noisy;
* the agent built without starting it, offline (tests/support/agent_imports.py): seconds to import and build, modules,
  resident memory, and which of the modules a plain agent loads only on a path that needs them it holds.

Stores: moto (the stack's DynamoDB emulator), postgres (a throwaway server, tests/support/postgres.py, as bench.scale
uses), sqlite (a file in the run directory).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.stack_cost import USER_DEFAULTS
from shardherd.services.local_stack.stack import LocalStack, StackOptions
from shardherd.shared.config import load_settings
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_factory import open_store
from tests.support.agent_imports import build_agent, store_env
from tests.support.postgres import PostgresServer

POLL = 0.02  # seconds between the bench's reads of the agent's row
STORES = ("moto", "postgres", "sqlite")
MiB = 2**20

BASELINE = """
import sys, time
import boto3
client = boto3.client("kinesis", region_name="us-east-1", endpoint_url=sys.argv[1])
client.describe_stream_summary(StreamName=sys.argv[2])
print("ready", flush=True)
time.sleep(60)
"""

@dataclass
class Footprint:
    """One process's figures: seconds from exec to ready, CPU seconds by then, resident and unshared memory (MiB),
    and the share of one core it used while reading (percent)."""

    ready: float
    cpu: float
    rss: float
    busy: float = 0.0
    uss: float = 0.0


def _rss(process: psutil.Process) -> float:
    return float(process.memory_info().rss) / MiB


def _uss(process: psutil.Process) -> float:
    return float(process.memory_full_info().uss) / MiB


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _until(what: str, limit: float, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + limit
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"not {what} within {limit:.0f} s")
        time.sleep(POLL)


def baseline(stack: LocalStack) -> Footprint:
    """A bare boto3 Kinesis client's process (the stack's AWS keys): exec to its first answer, CPU, resident memory."""
    began = time.monotonic()
    process = subprocess.Popen([sys.executable, "-c", BASELINE, str(stack.endpoints.kinesis), stack.stream],
                               stdout=subprocess.PIPE, env={**os.environ, **stack.job_env()})
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != b"ready":
            raise SystemExit("the baseline process did not answer")
        ready = time.monotonic() - began
        watched = psutil.Process(process.pid)
        return Footprint(ready, _cpu(watched), _rss(watched))
    finally:
        process.kill()
        process.wait(10)


def _owned_by(store: LeaseStore, worker: str, shards: int) -> bool:
    leases = store.scan_leases().leases
    return len(leases) == shards and all(lease.lease_owner == worker and not lease.checkpoint_owner
                                         for lease in leases)


def agent_footprint(run: Path, shards: int, rate: float, read: float) -> tuple[Footprint, Footprint]:
    """Start a stack without agents, then one plain agent: its footprint, and the baseline's against the same stack."""
    options = StackOptions(run_dir=run, shards=shards, agents=0, coordinators=1, rate=rate, spark=False, api_port=0)
    stack = LocalStack(options, load_settings())
    stack.start()
    store = open_store(stack.child_settings())
    try:
        bare = baseline(stack)
        began = time.monotonic()
        child = stack.add_agent()
        process = psutil.Process(child.pid)
        _until("a first heartbeat", 120, lambda: store.get_worker(child.name) is not None)
        ready = time.monotonic() - began
        cpu = _cpu(process)
        _until(f"every lease owned by {child.name}", 120, lambda: _owned_by(store, child.name, shards))
        peak, unshared, used, since = 0.0, 0.0, _cpu(process), time.monotonic()
        for _ in range(max(1, round(read))):
            time.sleep(1.0)
            peak, unshared = max(peak, _rss(process)), max(unshared, _uss(process))
        busy = 100 * (_cpu(process) - used) / (time.monotonic() - since)
        if not child.alive:
            raise SystemExit(f"{child.name} exited: see {child.log_path}")
        return Footprint(ready, cpu, peak, busy, unshared), bare
    finally:
        store.close()
        stack.stop()


def _store_env(kind: str, run: Path, postgres: PostgresServer | None) -> dict[str, str]:
    if kind == "moto":
        return {"SHARDHERD_STORE_BACKEND": "dynamodb"}
    url = postgres.url if postgres is not None else f"sqlite:///{run / 'store.db'}"
    return {"SHARDHERD_STORE_BACKEND": "sql", "SHARDHERD_SQL_URL": url}


def measure(kind: str, args: argparse.Namespace) -> None:
    """Print one store's lines: the agent built offline; the agent running, the baseline, their ratios."""
    with tempfile.TemporaryDirectory(prefix=f"footprint-{kind}-", dir=args.run_dir) as directory:
        run = Path(directory)
        built = build_agent(store_env("dynamodb" if kind == "moto" else kind, run))
        print(f"{kind:>8}: built offline in {built.seconds:.2f} s, {built.modules} modules, RSS {built.rss_mib:.1f} "
              f"MiB; deferred modules held: {', '.join(built.loaded) or 'none'}", flush=True)
        postgres = PostgresServer().start() if kind == "postgres" else None
        saved = dict(os.environ)
        os.environ.update({**USER_DEFAULTS, **_store_env(kind, run, postgres),
                           "SHARDHERD_STORE_METER_DIR": str(run / "meter")})
        try:
            agent, bare = agent_footprint(run, args.shards, args.rate, args.read)
        finally:
            os.environ.clear()
            os.environ.update(saved)
            if postgres is not None:
                postgres.stop()
    print(f"{kind:>8}: first heartbeat {agent.ready:.2f} s ({agent.cpu:.2f} CPU s), "
          f"RSS {agent.rss:.1f} MiB (USS {agent.uss:.1f}) and {agent.busy:.1f} % of a core holding {args.shards} "
          f"leases | "
          f"baseline ready {bare.ready:.2f} s "
          f"({bare.cpu:.2f} CPU s), RSS {bare.rss:.1f} MiB | ratios: heartbeat {agent.ready / bare.ready:.2f}, "
          f"CPU {agent.cpu / bare.cpu:.2f}, RSS {agent.rss / bare.rss:.2f}", flush=True)


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> int:
    """Measure each store in turn."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--stores", default=",".join(STORES), help="comma-separated: " + ", ".join(STORES))
    parser.add_argument("--shards", type=int, default=8, help="the stream's shards: the agent holds all of them")
    parser.add_argument("--read", type=float, default=10.0, help="seconds the agent reads before its memory counts")
    parser.add_argument("--rate", type=float, default=40.0, help="records/s the stack's producer puts")
    parser.add_argument("--run-dir", default=tempfile.gettempdir(), help="where each store's run directory goes")
    args = parser.parse_args(argv)
    stores = [kind for kind in args.stores.split(",") if kind]
    unknown = set(stores) - set(STORES)
    if unknown:
        parser.error(f"unknown stores: {', '.join(sorted(unknown))}")
    print(f"load average at start: {_load()}", flush=True)
    for kind in stores:
        measure(kind, args)
    print(f"load average at end: {_load()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
