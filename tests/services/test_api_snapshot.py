"""The API serves one snapshot per replica for `api_cache_millis`: pages, dashboards and scrapes add no scans."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from shardherd.services.api.snapshot import REFRESH_DEADLINE_SECONDS, SnapshotCache
from shardherd.services.coordinator_service import API_REFRESH, CoordinatorService
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from shardherd.shared.errors import StoreUnavailable
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_meter import StoreMeter, usage_total
from shardherd.shared.worker import LeaseProgress
from tests.coordinator.test_stand_down import ScansFail
from tests.services.harness import TOKEN, Replica
from tests.support.fast_settings import fast_settings
from tests.support.stores import make_store, unique_app
from tests.support.waiting import wait_for


@pytest.fixture
def meter(tmp_path: Path) -> Iterator[StoreMeter]:
    store: LeaseStore = make_store("sqlite", sqlite_path=str(tmp_path / "snapshot.db"))
    yield StoreMeter(store)
    store.close()


def _dashboard(replica: Replica) -> list[str]:
    """One dashboard refresh paging at limit=2, plus a scrape; the lease keys seen."""
    keys: list[str] = []
    cursor = None
    while True:
        query = "/v1/assignments?limit=2" + (f"&cursor={cursor}" if cursor else "")
        body = replica.client.get(query).json()
        keys += [item["lease_key"] for item in body["items"]]
        cursor = body["next_cursor"]
        if not cursor:
            break
    assert replica.client.get("/v1/workers").status_code == 200
    assert replica.client.get("/v1/leader").status_code == 200
    assert replica.client.get("/metrics").status_code == 200
    return keys


def test_the_leader_serves_its_runs_scans_and_a_follower_scans_once_per_max_age(meter: StoreMeter) -> None:
    leader = Replica(meter, shards=6, api_cache_millis=5_000)
    follower = Replica(meter, shards=6, replica_id="coord-b", clock=leader.clock, api_cache_millis=5_000)
    leader.join("w1")
    leader.join("w2")
    leader.step(2)
    owners = leader.owners()
    assert all(owners.values())
    meter.reset()
    for _ in range(3):
        assert _dashboard(leader) == sorted(owners)
    rows = meter.rows()
    assert usage_total(rows, operation="scan").requests == 0  # the newest run's scans, its own writes applied
    # Nor the lock or the status item: the leader serves the lock as it last wrote it and the status as its term
    # last read or published it (decision 0012).
    assert usage_total(rows, caller="api").requests == usage_total(rows, caller="metrics").requests == 0, rows
    assert leader.client.get("/v1/leader").json()["status"]["leader_id"] == "coord-a"
    body = leader.client.get("/v1/assignments?limit=100").json()
    assert {item["lease_key"]: item["owner"] for item in body["items"]} == owners
    for _ in range(3):
        assert _dashboard(follower) == sorted(owners)
    leases = usage_total(meter.rows(), table=meter.tables.leases, operation="scan")
    assert leases.requests == 1  # one scan for three refreshes of three pages and three scrapes
    follower.clock.advance(5)
    _dashboard(follower)
    assert usage_total(meter.rows(), table=meter.tables.leases, operation="scan").requests == 2


def test_store_calls_are_attributed_to_leader_lock_api_and_metrics(meter: StoreMeter) -> None:
    replica = Replica(meter, shards=4)
    replica.join("w1")
    replica.step(2)
    assert replica.client.get("/v1/workers").status_code == 200
    assert replica.client.get("/metrics").status_code == 200
    callers = meter.by_caller()
    assert {"leader", "lock", "api", "metrics"} <= set(callers)
    assert callers["leader"].read_units > 0 and callers["leader"].write_units > 0  # scans; assignments
    assert callers["lock"].write_units > 0  # acquire and heartbeats
    assert callers["api"].read_units > 0 and callers["metrics"].read_units > 0


def test_while_the_leader_ticks_on_its_view_the_api_serves_that_view_as_of_its_scan(meter: StoreMeter) -> None:
    """Decision 0010: between full scans the leader's view is up to a full-scan interval old; the API serves it to
    anonymous callers, judged as of the scan (heartbeat ages as the leader saw them), and scans nothing itself. A
    caller with a token gets figures at most `api_cache_millis` old instead (issue 33): one read of the store."""
    leader = Replica(meter, shards=4, api_cache_millis=5_000, api_token="admin-token-0123456789")
    for worker in ("w1", "w2"):
        leader.join(worker)
        leader.loop.feed.connect(worker)  # both long-poll the leader: it may tick on its view

    def poll_again() -> None:  # a long-poll counts as presence while fresh: agents ask again every heartbeat period
        for worker in ("w1", "w2"):
            leader.loop.feed.disconnect(worker, dropped=False)
            leader.loop.feed.connect(worker)

    for _ in range(8):
        poll_again()
        leader.step(1)
    poll_again()
    quiet = leader.step(1)[0]
    assert quiet is not None and not quiet.scanned
    meter.reset()
    for _ in range(4):  # 8 s of quiet ticks: older than api_cache_millis, younger than the full-scan interval
        poll_again()
        leader.step(1)
        workers = leader.client.get("/v1/workers").json()
        assert usage_total(meter.rows(), caller="api", operation="scan").requests == 0
    # Ages as of the leader's scan (the rows had just changed there), not growing while the view stands.
    assert [worker["state"] for worker in workers["items"]] == ["active", "active"], workers
    assert all(worker["heartbeat_age_seconds"] == 0.0 for worker in workers["items"]), workers
    token = {"Authorization": "Bearer admin-token-0123456789"}
    leader.clock.advance(6.0)  # the leader's view (its last full scan or before) is now older than the cache
    for _ in range(2):  # the second within api_cache_millis: the same snapshot
        assert leader.client.get("/v1/workers", headers=token).status_code == 200
    assert usage_total(meter.rows(), caller="api", operation="scan").requests == 2  # both tables, once
    leader.clock.advance(6.0)
    assert leader.client.get("/metrics", headers=token).status_code == 200  # scrapes take the view: no read
    assert usage_total(meter.rows(), caller="api", operation="scan").requests == 2


def test_checkpoint_ages_and_records_per_second_read_right_through_a_cached_snapshot(meter: StoreMeter) -> None:
    """Polls between checkpoints and against a cached snapshot: the rate is the records over the time between the
    checkpoints (never 0 while records go through, the same for two polls of the same data); ages grow per answer."""
    replica = Replica(meter, shards=2, api_cache_millis=5_000)
    replica.join("w1")
    replica.step(2)
    key, owner = sorted(replica.owners().items())[0]
    assert owner == "w1"

    def read() -> tuple[float | None, float]:
        lease = next(item for item in replica.client.get("/v1/assignments").json()["items"]
                     if item["lease_key"] == key)
        return lease["records_per_second"], lease["checkpoint_age_seconds"]

    readings = []
    for poll in range(20):  # a checkpoint of 150 more records every 3 s: 50 records/s
        assert meter.checkpoint(key, owner, Checkpoint(str(1000 + poll)),
                                progress=LeaseProgress(0, 150 * (poll + 1), 1500 * (poll + 1))).applied
        replica.step(1)  # the leader's run scans the leases (the API serves its view), then 2 s pass
        first = read()
        replica.clock.advance(1.0)
        again = read()  # the same cached snapshot, a second later
        readings.append((first, again))
        assert again[0] == first[0] and again[1] == first[1] + 1.0, readings
    rates = [first[0] for first, _ in readings[2:]]  # from 6 s of checkpoints on
    assert rates == [50.0] * len(rates), readings
    # The checkpoint moved 2 s before each first read: the leader serves its newest run's view at once.
    assert all(age == 2.0 for (_, age), _ in readings), readings


def test_an_older_scan_after_a_newer_read_does_not_reset_the_rates() -> None:
    """Anonymous callers get the leader's view while callers with a token get newer reads: the view's lower counts,
    judged after a newer read, used to restart each series (the dashboard then showed no rate for 5 s)."""
    from shardherd.services.api.fleet import CheckpointAges
    from shardherd.services.api.models import LeaseOut
    from shardherd.shared.clock import ManualClock

    clock = ManualClock()
    ages = CheckpointAges(clock)

    def lease(records: int) -> LeaseOut:
        return LeaseOut.model_construct(lease_key="s-1", checkpoint=str(records), records_processed=records,
                                        checkpoint_owner=None, owner="w1", checkpoint_written_at=None)

    for records in (100, 200, 300):  # fresh reads, 3 s apart
        rate = ages.motions([lease(records)])["s-1"].records_per_second
        clock.advance(3.0)
    assert rate is not None and rate == pytest.approx(100 / 3, abs=0.1)
    old_view = clock.monotonic() - 8.0  # the leader's view, scanned before the last read
    assert ages.motions([lease(150)], at=old_view)["s-1"].records_per_second is not None
    assert ages.motions([lease(400)])["s-1"].records_per_second == pytest.approx(100 / 3, abs=0.1)


def _tables_age(replica: Replica) -> float:
    """The age of the tables a caller with a token is served now (the leader's `/v1/snapshot?fresh=true`)."""
    answer = replica.client.get("/v1/snapshot?fresh=true", headers=replica.auth())
    assert answer.status_code == 200, answer.text
    age: float = answer.json()["age_seconds"]
    return age


def _refreshed_leader(meter: StoreMeter) -> tuple[Replica, SnapshotCache, Callable[[], int]]:
    """A leader whose view is 2 s old (callers with a token get tables read from the store), its snapshot cache with
    the refresher enabled (the test's thread runs its steps), and a count of the API's scans since."""
    leader = Replica(meter, shards=4, api_cache_millis=1_000, api_token=TOKEN)
    leader.join("w1")
    leader.join("w2")
    leader.step(2)
    cache = leader.context.snapshots
    cache.threaded()
    meter.reset()
    return leader, cache, lambda: usage_total(meter.rows(), caller="api", operation="scan").requests


def test_callers_with_a_token_are_served_while_the_refresher_reads_their_tables_ahead(meter: StoreMeter) -> None:
    """services/api/snapshot.py, invariant 2: a call finding the tables older than half api_cache_millis asks the
    refresher and is served them without a read on its own thread; the refresher reads both tables once."""
    leader, cache, scans = _refreshed_leader(meter)
    assert _tables_age(leader) == 0.0 and scans() == 2  # nothing cached yet: this caller reads both tables
    leader.clock.advance(0.4)
    assert _tables_age(leader) == pytest.approx(0.4)
    cache.step()  # nobody asked: nothing read
    assert scans() == 2
    leader.clock.advance(0.2)
    assert _tables_age(leader) == pytest.approx(0.6) and scans() == 2  # past half: served, and asked for new ones
    assert _tables_age(leader) == pytest.approx(0.6)  # asked again while the first ask waits: one refresh
    cache.step()
    assert scans() == 4  # both tables, once, on the refresher's thread
    assert _tables_age(leader) == 0.0 and scans() == 4
    for _ in range(6):  # callers keep coming every 0.3 s: none reads, none is served tables older than 0.6 s
        leader.clock.advance(0.3)
        assert _tables_age(leader) <= 0.6 + 1e-9
        cache.step()
    assert scans() == 4 + 2 * 3  # a refresh every other call: half api_cache_millis at most between them


def test_a_call_past_the_promise_reads_itself_and_an_idle_api_reads_nothing(meter: StoreMeter) -> None:
    """Invariants 1 and 3: tables older than api_cache_millis (the refresher slow or failing) are read on the call,
    as without the refresher, and an ask it finds answered costs nothing; with no callers nothing is read."""
    leader, cache, scans = _refreshed_leader(meter)
    assert _tables_age(leader) == 0.0
    leader.clock.advance(0.6)
    assert _tables_age(leader) == pytest.approx(0.6)  # asked; the refresher is slow (no step yet)
    leader.clock.advance(0.5)
    assert _tables_age(leader) == 0.0 and scans() == 4  # older than api_cache_millis: read on the call
    cache.step()  # the earlier ask finds the tables new: no second read
    assert scans() == 4
    leader.clock.advance(30.0)  # nobody calls: the refresher reads nothing
    for _ in range(2):
        cache.step()
    assert scans() == 4
    assert leader.client.get("/v1/assignments").status_code == 200  # anonymous: the leader's view, no read, no ask
    cache.step()
    assert scans() == 4


def test_a_failed_refresh_raises_in_its_thread_and_callers_never_get_older_tables_than_promised(
        moto_server: MotoServer) -> None:
    """The refresher's reads give up at REFRESH_DEADLINE_SECONDS (virtual time: the retries' sleeps pass on the
    test's clock) and raise in its thread; the cache stays as it was, and a caller finding it older than
    api_cache_millis reads itself and gets the store's trouble as a 503, never the old tables."""
    clock = ManualClock()
    with ScansFail(moto_server.endpoint_url) as proxy:
        # Retries enough that the refresher's deadline, not their count, ends its attempt.
        store = make_store("dynamodb", moto_url=proxy.endpoint_url,
                           retry=RetryPolicy(max_attempts=40, clock=clock, rng=random.Random(7)))
        try:
            leader = Replica(store, shards=4, clock=clock, api_cache_millis=1_000, api_token=TOKEN)
            leader.join("w1")
            leader.step(2)
            cache = leader.context.snapshots
            cache.threaded()
            assert _tables_age(leader) == 0.0
            clock.advance(0.6)
            assert _tables_age(leader) == pytest.approx(0.6)  # asks for a refresh
            proxy.failing = True
            started = clock.monotonic()
            with pytest.raises(StoreUnavailable, match="deadline comes first"):
                cache.step()
            assert clock.monotonic() - started <= REFRESH_DEADLINE_SECONDS
            leader.lock.tick()  # the lock's heartbeat over the retries' virtual seconds (it writes, never scans)
            assert leader.lock.is_leader()
            answer = leader.client.get("/v1/snapshot?fresh=true", headers=leader.auth())
            assert answer.status_code == 503 and "StoreUnavailable" in answer.json()["detail"], answer.text
            proxy.failing = False
            leader.lock.tick()  # its own retries took virtual seconds too
            assert _tables_age(leader) == 0.0
        finally:
            store.close()


def test_the_coordinators_refresher_runs_supervised_and_ends_with_the_service(tmp_path: Path) -> None:
    """A real CoordinatorService: the refresher is a supervised thread (`api-refresh`), callers with a token get
    tables at most api_cache_millis old while they keep calling, and stop() leaves no refresher thread running."""
    settings = load_settings(application_name=unique_app("refresh"), store_backend="sql",
                             sql_url=f"sqlite:///{tmp_path / 'leases.db'}", worker_id="coord-1", api_host="127.0.0.1",
                             api_port=0, api_token=TOKEN, **fast_settings())
    service = CoordinatorService.build(settings)
    service.start()
    try:
        assert service.api is not None
        with httpx.Client(base_url=service.api.url, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            wait_for(lambda: client.get("/v1/snapshot?fresh=true").status_code == 200, 20, "the replica leads")
            ended = time.monotonic() + 3.0
            ages = []
            while time.monotonic() < ended:
                answer = client.get("/v1/snapshot?fresh=true")
                assert answer.status_code == 200, answer.text
                ages.append(answer.json()["age_seconds"])
            assert max(ages) <= settings.api_cache_millis / 1000, ages
        refresher = next(state for state in service.supervisor.snapshot() if state.name == API_REFRESH)
        assert refresher.restarts == 0 and refresher.last_error is None
    finally:
        service.stop()
    assert not [thread for thread in threading.enumerate() if thread.name == API_REFRESH and thread.is_alive()]
