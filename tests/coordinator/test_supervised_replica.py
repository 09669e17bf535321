"""Real coordinator replicas (CoordinatorService, threads, API) on moto and kinesalite, with faults from proxies.

Issue 30's coordinator cells: a blackholed Kinesis must not delay failing over a dead worker's leases; a replica
whose store keeps denying it must give the lock up (to another replica, or by exiting), never hold it idle; a leader
loop whose thread dies turns /healthz red and ends the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shardherd.services.coordinator_service import LEADER_LOOP, CoordinatorService
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.config import load_settings
from shardherd.shared.store import LeaseStore
from shardherd.shared.supervision import EXIT_GAVE_UP
from shardherd.shared.worker import WorkerRecord
from tests.support.chaos_proxy import CALM, Chaos, ChaosProxy
from tests.support.fast_settings import fast_settings
from tests.support.faulty_proxy import Fault, FaultyProxy
from tests.support.stores import make_store, unique_app
from tests.support.waiting import wait_for

FAILOVER = 2.0
ACCESS_DENIED = Fault(400, "AccessDeniedException")


class Beats:
    """Workers heartbeating through the store every 0.2 s, as agents do."""

    def __init__(self, store: LeaseStore, *alive: str) -> None:
        self.store = store
        self.alive = set(alive)
        self._count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._count += 1
            for worker in sorted(self.alive):
                self.store.upsert_worker(WorkerRecord(worker, int(time.time()), heartbeat=self._count))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


class Exits:
    """Stands in for os._exit: records the status and stops the replica's threads, as the process ending would."""

    def __init__(self) -> None:
        self.codes: list[int] = []
        self.service: CoordinatorService | None = None

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        if self.service is not None:
            self.service.request_stop()


def _start(app: str, store_url: str, name: str, exits: Exits | None = None, **extra: Any) -> CoordinatorService:
    settings = load_settings(application_name=app, store_backend="dynamodb", dynamodb_endpoint_url=store_url,
                             worker_id=name, api_port=0, **fast_settings(failover_time_millis=int(FAILOVER * 1000),
                                                                          **extra))
    service = CoordinatorService.build(settings, exit=exits)
    if exits is not None:
        exits.service = service
    service.start()
    return service


def _owners(store: LeaseStore) -> dict[str, str | None]:
    return {lease.lease_key: lease.lease_owner for lease in store.scan_leases().leases}


def _leader(store: LeaseStore) -> object:
    item = store.get_state("Leader")
    return item.get("ownerName") if item else None


@pytest.fixture
def blackholable_kinesis(kinesalite: NodeEmulator) -> Iterator[tuple[ChaosProxy, str]]:
    client = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    stream = unique_app("blackhole")
    client.create_stream(StreamName=stream, ShardCount=4)
    wait_for(lambda: client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"]
             == "ACTIVE", 30, "stream ACTIVE")
    with ChaosProxy(kinesalite.endpoint_url) as proxy:
        yield proxy, stream


def test_a_blackholed_kinesis_does_not_delay_failing_over_a_dead_workers_leases(
        moto_server: MotoServer, blackholable_kinesis: tuple[ChaosProxy, str]) -> None:
    proxy, stream = blackholable_kinesis
    app = unique_app("blackhole")
    store = make_store("dynamodb", moto_url=moto_server.endpoint_url, app=app)
    beats = Beats(store, "w1", "w2")
    service = _start(app, moto_server.endpoint_url, "coord-1", stream_name=stream,
                     kinesis_endpoint_url=proxy.endpoint_url)
    try:
        wait_for(lambda: len(_owners(store)) == 4 and set(_owners(store).values()) == {"w1", "w2"}, 30,
                 "4 leases spread over w1 and w2")
        proxy.set(Chaos(hang=True))  # every ListShards now hangs: shard sync attempts run into their deadline
        wait_for(lambda: proxy.served["hung"] >= 2, 10, "two listings into the blackhole")
        beats.alive = {"w2"}  # w1 is killed while Kinesis is unreachable
        killed = time.monotonic()
        took = wait_for(lambda: set(_owners(store).values()) == {"w2"}, 30, "w1's leases on w2")
        print(f"\nKinesis blackholed: a killed worker's leases on a live worker after {took:.1f} s "
              f"(failover {FAILOVER:.0f} s)")
        assert time.monotonic() - killed < FAILOVER + 5
        assert service.supervisor.gave_up is None  # nothing critical stalled: the listing runs on its own thread
        listing = next(state for state in service.supervisor.snapshot() if state.name == "shard-listing")
        assert listing.restarts == 0  # a failed listing is a result handed to the loop, not a thread failure
        proxy.set(CALM)
    finally:
        service.stop()
        beats.stop()
        store.close()


class DeniesScans(FaultyProxy):
    """Answers Scan and DeleteItem with AccessDenied while `denying` (an IAM change took them away)."""

    denying = False

    def _next(self, target: str) -> Fault | None:
        if self.denying and target.endswith((".Scan", ".DeleteItem")):
            return ACCESS_DENIED
        return super()._next(target)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_replica_whose_store_keeps_denying_it_never_holds_the_lock_idle(moto_server: MotoServer,
                                                                          replicas: int) -> None:
    """Alone, the replica exits (the orchestrator restarts it); with a second replica, that one leads."""
    app = unique_app("denied")
    store = make_store("dynamodb", moto_url=moto_server.endpoint_url, app=app)
    beats = Beats(store, "w1")
    proxy = DeniesScans(moto_server.endpoint_url)
    with proxy:
        exits = Exits()
        first = _start(app, proxy.endpoint_url, "coord-a", exits)
        others: list[CoordinatorService] = []
        try:
            wait_for(lambda: _leader(store) == "coord-a", 20, "coord-a to lead")
            others = [_start(app, moto_server.endpoint_url, "coord-b") for _ in range(replicas - 1)]
            proxy.denying = True
            denied = time.monotonic()
            idle_holds = []

            def settled() -> bool:
                holder = _leader(store)
                loop_alive = any(t.name == LEADER_LOOP and t.is_alive() for t in first._threads)
                if holder == "coord-a" and first.lock.is_leader() and not loop_alive:
                    idle_holds.append(time.monotonic() - denied)
                return holder == "coord-b" if others else bool(exits.codes)

            took = wait_for(settled, 20, "another replica to lead" if others else "coord-a to exit")
            print(f"\nstore denying coord-a ({replicas} replicas): settled after {took:.1f} s")
            assert took < FAILOVER + 5
            assert not idle_holds
            if not others:
                assert exits.codes == [EXIT_GAVE_UP] and not first.lock.is_leader()
                assert "failed runs" in (first.supervisor.gave_up or "")
        finally:
            for service in (first, *others):
                service.stop()
    beats.stop()
    store.close()


def test_a_leader_loop_that_dies_turns_healthz_red_and_ends_the_process(moto_server: MotoServer) -> None:
    """An exception escaping the loop's run (here: a stream name no leader run can list, raised by a broken hook)."""
    app = unique_app("dies")
    store = make_store("dynamodb", moto_url=moto_server.endpoint_url, app=app)
    exits = Exits()
    service = _start(app, moto_server.endpoint_url, "coord-a", exits)
    try:
        wait_for(lambda: service.lock.is_leader(), 20, "coord-a to lead")
        assert service.api is not None
        with httpx.Client(base_url=service.api.url, timeout=5) as client:
            assert client.get("/healthz").status_code == 200

            def boom() -> None:
                raise RuntimeError("injected into the leader loop")

            service.loop._on_progress = None
            service.loop.feed.observe = lambda *args: boom()  # type: ignore[method-assign]
            # The next full run raises out of its bookkeeping; after the threshold the replica gives up.
            took = wait_for(lambda: client.get("/healthz").status_code == 503, 10, "/healthz red")
            print(f"\nleader loop failing: /healthz red after {took:.1f} s")
            assert took <= 3 * 0.3 * 3 + 1
            assert exits.codes == [EXIT_GAVE_UP]
            assert "gave up" in client.get("/healthz").json()["detail"]
            assert "shardherd_process_gave_up 1.0" in client.get("/metrics").text
        assert _leader(store) is None  # released before the exit: a successor need not wait for expiry
    finally:
        service.stop()
        store.close()
