"""A real coordinator on 127.0.0.1: no request without a token makes anyone scan the store; token holders only rarely.

The store is metered (shared/store_meter.py): scans are counted by caller, `api` for request handlers and `leader`
for the leader loop. Two workers heartbeat and listen on the coordinator channel with the read token, so once the
fleet settles the leader scans only when told to (its full-scan interval is ten minutes here): every scan in the
windows below is one a request caused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from shardherd.services.coordinator_service import CoordinatorService
from shardherd.shared.checkpoint import TRIM_HORIZON
from shardherd.shared.config import load_settings
from shardherd.shared.lease import new_lease
from shardherd.shared.store_factory import open_store
from shardherd.shared.store_meter import StoreMeter
from shardherd.shared.worker import CPU_METRIC, WorkerRecord
from tests.services.harness import TOKEN as ADMIN_TOKEN
from tests.support.fast_settings import fast_settings
from tests.support.stores import unique_app
from tests.support.waiting import wait_for

READ_TOKEN = "read-token-0123456789abcdef"
WORKERS = ("worker-a", "worker-b")
SHARDS = [f"shardId-{i:012d}" for i in range(4)]
WINDOW_SECONDS = 3.0


@dataclass
class Stack:
    service: CoordinatorService
    meter: StoreMeter
    url: str

    def scans(self, caller: str) -> int:
        """Scan pages of either table the meter counted for `caller` so far."""
        return sum(row.requests for row in self.meter.rows() if row.caller == caller and row.operation == "scan")


def _listen(url: str, worker: str, stop: threading.Event) -> None:
    """A worker's long-poll on the channel with the read token, as the agent's watch sends it."""
    feed, after = None, 0
    with httpx.Client(base_url=url, timeout=10, headers={"Authorization": f"Bearer {READ_TOKEN}"}) as client:
        while not stop.is_set():
            params: dict[str, str | int | float] = {"after": after, "wait": 1.0, **({"feed": feed} if feed else {})}
            response = client.get(f"/v1/workers/{worker}/assignments/changes", params=params)
            if response.status_code == 200:
                body = response.json()
                feed, after = body["feed"], body["version"]
            else:
                stop.wait(0.2)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("load")
    settings = load_settings(
        application_name=unique_app("load"), store_backend="sql", sql_url=f"sqlite:///{home / 'leases.db'}",
        worker_id="coord-1", api_host="127.0.0.1", api_port=0, api_token=ADMIN_TOKEN, api_read_token=READ_TOKEN,
        store_meter_dir=str(home / "meter"), api_cache_millis=0,
        # Quiet once settled: the leader scans only when something asks it to (a full scan every ten minutes).
        **fast_settings(failover_time_millis=30_000, leader_full_scan_interval_millis=600_000),
    )
    seeder = open_store(settings.model_copy(update={"store_meter_dir": None}))
    seeder.ensure_tables()
    for shard in SHARDS:
        seeder.create_lease(new_lease(shard, TRIM_HORIZON))
    stop = threading.Event()

    def heartbeat() -> None:
        beat = 0
        while not stop.is_set():
            beat += 1
            for worker in WORKERS:
                seeder.upsert_worker(WorkerRecord(worker, int(time.time()), metric_stats={CPU_METRIC: (30.0, 30.0)},
                                                  operating_range={CPU_METRIC: (100.0,)}, heartbeat=beat))
            stop.wait(0.3)

    threads = [threading.Thread(target=heartbeat, daemon=True)]
    service = CoordinatorService.build(settings)
    service.start()
    assert service.api is not None and isinstance(service.store, StoreMeter)
    threads += [threading.Thread(target=_listen, args=(service.api.url, worker, stop), daemon=True)
                for worker in WORKERS]
    for thread in threads:
        thread.start()
    running = Stack(service, service.store, service.api.url)
    try:
        wait_for(lambda: all(lease.lease_owner for lease in seeder.scan_leases().leases), 30, "all leases assigned")
        wait_for(lambda: _quiet(running), 60, "a leader that scans only when asked")
        yield running
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        service.stop()
        seeder.close()


def _quiet(stack: Stack, seconds: float = 1.5) -> bool:
    before = stack.scans("leader")
    time.sleep(seconds)
    return stack.scans("leader") == before


def _anonymous_flood(url: str) -> int:
    """Every request an anonymous caller could use to load the leader, a few times each; how many were sent."""
    sent = 0
    with httpx.Client(base_url=url, timeout=10) as client:
        deadline = time.monotonic() + WINDOW_SECONDS
        while time.monotonic() < deadline:
            fake = f"made-up-{sent}"
            assert client.post("/v1/plan").status_code == 401
            assert client.get(f"/v1/workers/{fake}/assignments/changes",
                              params={"news": "true", "wait": 0}).status_code == 200
            assert client.get(f"/v1/workers/{WORKERS[0]}/assignments/changes",
                              params={"news": "true", "wait": 0}).status_code == 200
            for path in ("/v1/workers", "/v1/assignments?explain=true", "/v1/leader", "/metrics"):
                assert client.get(path).status_code == 200, path
            sent += 7
    return sent


def test_no_store_scan_is_caused_by_an_unauthenticated_request(stack: Stack) -> None:
    assert _quiet(stack, WINDOW_SECONDS)  # the baseline: nobody asks, nobody scans
    leader, api = stack.scans("leader"), stack.scans("api")
    sent = _anonymous_flood(stack.url)
    time.sleep(1.0)  # a signal would start a leader run within a quarter interval
    assert sent >= 21  # three rounds at least
    assert (stack.scans("leader") - leader, stack.scans("api") - api) == (0, 0)


def test_token_holders_cause_scans_but_at_a_small_rate(stack: Stack) -> None:
    """The same requests with the read token do reach the leader (so the count above could fail), rate-limited."""
    read = {"Authorization": f"Bearer {READ_TOKEN}"}
    with httpx.Client(base_url=stack.url, timeout=30, headers=read) as client:
        api, started = stack.scans("api"), time.monotonic()
        for _ in range(5):
            assert client.post("/v1/plan").status_code == 200
        gap = stack.service.settings.lease_assignment_interval_millis / 1000  # PlanCache.min_gap here
        dry_runs = (stack.scans("api") - api) / 2  # a dry run scans both tables
        assert 1 <= dry_runs <= (time.monotonic() - started) / gap + 1  # not one per caller: one per gap at most

        leader = stack.scans("leader")
        started = time.monotonic()
        while time.monotonic() - started < WINDOW_SECONDS:
            assert client.get("/v1/workers/made-up/assignments/changes",
                              params={"news": "true", "wait": 0}).status_code == 200
        time.sleep(0.5)
        runs = (stack.scans("leader") - leader) / 2  # a full run scans both tables
        assert 1 <= runs <= 2 * (WINDOW_SECONDS + 0.5) / gap + 1  # woken at most once per interval


def test_the_read_token_cannot_drain_and_the_admin_token_can(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        refused = client.post(f"/v1/workers/{WORKERS[1]}/drain", headers={"Authorization": f"Bearer {READ_TOKEN}"})
        assert refused.status_code == 403 and "admin token" in refused.json()["detail"]
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert client.post(f"/v1/workers/{WORKERS[1]}/drain", headers=admin).status_code == 200
        assert client.post(f"/v1/workers/{WORKERS[1]}/undrain", headers=admin).status_code == 200
