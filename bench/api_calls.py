"""CPU and wall time per operator-API call at the scale run's size, in one process, against a fixed reference.

    python -u -m bench.api_calls [--shards 256] [--workers 34] [--rounds 200] [--rounds-per-run 10] [--store postgres]

The scale run (bench/scale.py, 256 shards x 32 agents + 2 Spark agents on two cores) measures `/v1/assignments`
p99 at load 8-18, where the tail follows the CPU each call takes in a process it shares with the leader's runs. This
bench measures that CPU alone: the leader replica of the API tests (tests/services/harness.py: the real lock, leader
loop and API on a virtual clock) over a real store (a throwaway PostgreSQL, or moto), with `--workers` workers
heartbeating, every lease owned and checkpointed with its owner's progress, served by the real server
(services/api/server.py: uvicorn on loopback) to an httpx client with the admin token.

A round is every page of `/v1/assignments?limit=100` (3 at 256 shards) with the admin token, as the scale run's
calls; then as many anonymous `/metrics` scrapes. Between rounds the virtual clock moves `--round-seconds`, and the
leader runs (outside the timing) every lease-assignment interval (2 s; full scans every 20 s, the scale run's
defaults), so the snapshot changes as in the live stack. The API's `api-refresh` thread runs as in the coordinator
(services/coordinator_service.py): a caller with a token finding the tables older than half of `api_cache_millis`
(1 s) has it read new ones, so its reads are CPU the calls cause. Printed per request kind: the server's CPU per call
(the process's CPU time over the phase minus the main thread's, which runs the client and the leader), the wall
p50/p99, and the ratio of the CPU per call to a reference measured in the same run: `json.dumps` of the first page's
decoded body (a call cannot cost less than encoding its answer once). The start-up (the store, the fleet, the first
snapshot) is not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import httpx

from bench.scale import percentiles
from shardherd.services.api import create_app
from shardherd.services.api.server import ApiServer
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.store import LeaseStore
from shardherd.shared.worker import LeaseProgress
from tests.services.harness import INTERVAL, TOKEN, Replica
from tests.support.postgres import PostgresServer
from tests.support.stores import make_store

PAGE = 100
REFERENCE_REPEATS = 200


@dataclass
class Calls:
    """One request kind's figures: wall milliseconds per call, and the server's CPU seconds over the phase."""

    walls: list[float] = field(default_factory=list)
    cpu: float = 0.0

    def timed(self, call: Callable[[], httpx.Response]) -> httpx.Response:
        """Run `call`, adding its wall time; its answer, checked."""
        started = time.perf_counter()
        answer = call()
        self.walls.append((time.perf_counter() - started) * 1000)
        return answer.raise_for_status()

    @contextmanager
    def phase(self) -> Iterator[None]:
        """Count the CPU the process spends meanwhile on other threads than this one (client and leader)."""
        process, thread = time.process_time(), time.thread_time()
        yield
        self.cpu += (time.process_time() - process) - (time.thread_time() - thread)

    def line(self, name: str, reference: float) -> str:
        """CPU per call (ms), its ratio to the reference, and the wall percentiles."""
        per_call = self.cpu / len(self.walls)
        return (f"{name}: server CPU {per_call * 1000:.2f} ms/call ({per_call / reference:.1f}x the reference), "
                f"wall {percentiles(self.walls)}")


@contextmanager
def _store(kind: str) -> Iterator[LeaseStore]:
    """Fresh tables on a throwaway PostgreSQL or moto server, closed and stopped on exit."""
    if kind == "postgres":
        postgres = PostgresServer().start()
        try:
            store = make_store("postgres", postgres_url=postgres.url)
            yield store
            store.close()
        finally:
            postgres.stop()
    else:
        with MotoServer() as moto:
            store = make_store("dynamodb", moto_url=moto.endpoint_url)
            yield store
            store.close()


def _fleet(store: LeaseStore, shards: int, workers: int) -> Replica:
    """The leader replica with every lease owned, checkpointed and reported on by `workers` workers."""
    replica = Replica(store, shards=shards, api_cache_millis=1_000, api_token=TOKEN,
                      leader_full_scan_interval_millis=20_000)
    for index in range(workers):
        replica.join(f"agent-{index:02d}", cpu=20.0 + index % 7)
    for _ in range(60):
        replica.step()
        if all(replica.owners().values()):
            break
    leases = store.scan_leases().leases
    for index, lease in enumerate(leases):
        owner = lease.lease_owner
        assert owner is not None, "a lease left unowned"
        progress = LeaseProgress(millis_behind_latest=index * 7 % 900, records=1_000 + index * 37,
                                 bytes=250_000 + index * 9_100, records_behind=index % 5 or None)
        store.checkpoint(lease.lease_key, owner, Checkpoint(str(49_650_000_000_000_000_000_000_000_000 + index) * 1),
                         progress)
        replica.lease_throughput.setdefault(owner, {})[lease.lease_key] = 1.0 + index % 13 / 4
        replica.lease_progress.setdefault(owner, {})[lease.lease_key] = progress
    replica.step(2)
    return replica


def _reference(http: httpx.Client, url: str) -> float:
    """Seconds one `json.dumps` of the first page's body takes in this process (median of REFERENCE_REPEATS)."""
    body = http.get(f"{url}/v1/assignments", params={"limit": PAGE}, headers={"Authorization": f"Bearer {TOKEN}"})
    page = body.raise_for_status().json()
    times = []
    for _ in range(REFERENCE_REPEATS):
        started = time.thread_time()
        json.dumps(page, ensure_ascii=False, separators=(",", ":"))
        times.append(time.thread_time() - started)
    return statistics.median(times)


def _pages(http: httpx.Client, url: str, pages: Calls) -> int:
    """Every page of /v1/assignments with the token, each timed; how many leases they listed."""
    cursor: str | None = None
    seen = 0
    while True:
        params: dict[str, str | int] = {"limit": PAGE, **({"cursor": cursor} if cursor else {})}
        body = pages.timed(partial(http.get, f"{url}/v1/assignments", params=params,
                                   headers={"Authorization": f"Bearer {TOKEN}"})).json()
        seen += len(body["items"])
        cursor = body["next_cursor"]
        if not cursor:
            return seen


def _rounds(replica: Replica, args: argparse.Namespace, call: Callable[[], object]) -> None:
    """`args.rounds` calls, the virtual clock moving `args.round_seconds` after each, the leader running on time."""
    due = replica.clock.monotonic()
    for _ in range(args.rounds):
        if replica.clock.monotonic() >= due:
            replica.heartbeat()
            replica.lock.tick()
            replica.loop.run_once()
            due += INTERVAL
        call()
        replica.clock.advance(args.round_seconds)


@contextmanager
def _refresher(replica: Replica, spent: list[float]) -> Iterator[None]:
    """The API's `api-refresh` thread, as the coordinator runs it (supervised there), stopped on exit.

    `spent` gets the thread's CPU seconds so far after each step.
    """
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            replica.context.snapshots.step()
            spent[0] = time.thread_time()

    thread = threading.Thread(target=run, name="api-refresh", daemon=True)
    replica.context.snapshots.threaded()
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def main(argv: list[str] | None = None) -> int:
    """Build the fleet, serve it, time the calls, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=256)
    parser.add_argument("--workers", type=int, default=34)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--round-seconds", type=float, default=0.1, help="virtual time between rounds")
    parser.add_argument("--store", choices=("postgres", "moto"), default="postgres")
    args = parser.parse_args(argv)
    with _store(args.store) as store:
        replica = _fleet(store, args.shards, args.workers)
        server = ApiServer(create_app(replica.context), "127.0.0.1", 0).start()
        try:
            refresher = [0.0]
            with httpx.Client(timeout=30.0) as http, _refresher(replica, refresher):
                reference = _reference(http, server.url)
                pages, scrapes = Calls(), Calls()
                before = refresher[0]
                with pages.phase():
                    _rounds(replica, args, partial(_every_page, http, server.url, pages, args.shards))
                refreshing = refresher[0] - before
                with scrapes.phase():
                    _rounds(replica, args, lambda: scrapes.timed(lambda: http.get(f"{server.url}/metrics")))
        finally:
            server.stop()
    print(f"{args.shards} leases, {args.workers} workers, {args.store}; {args.rounds} rounds {args.round_seconds} s "
          f"apart (load {os.getloadavg()[0]:.1f})")
    print(f"reference: json.dumps of a {PAGE}-lease page {reference * 1000:.2f} ms")
    print(pages.line(f"/v1/assignments?limit={PAGE} (token)", reference))
    print(f"  of which the api-refresh thread's reads for them: {refreshing / len(pages.walls) * 1000:.2f} ms/call")
    print(scrapes.line("/metrics (anonymous)", reference))
    return 0


def _every_page(http: httpx.Client, url: str, pages: Calls, shards: int) -> None:
    """Every page of /v1/assignments, timed, checked to list every lease once."""
    listed = _pages(http, url, pages)
    if listed != shards:
        raise AssertionError(f"the pages listed {listed} leases, not {shards}")


if __name__ == "__main__":
    raise SystemExit(main())
