"""The replica list: every replica reports itself, optimistic writes keep concurrent reports, stale ones age out."""

from __future__ import annotations

from shardherd.coordinator.run_summary import RunSummary
from shardherd.services.replicas import (
    FORGET_SECONDS,
    KEEPALIVE_SECONDS,
    REPLICAS_KEY,
    ReplicaReporter,
    read_replicas,
)
from shardherd.shared.clock import ManualClock
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_meter import StoreMeter
from tests.services.harness import Replica


def _reporter(store: LeaseStore, name: str, clock: ManualClock, leading: bool = False) -> ReplicaReporter:
    reporter = ReplicaReporter(store, name, clock, lambda: (leading, 3 if leading else None))
    reporter.set_api_url(f"http://127.0.0.1:1/{name}")
    return reporter


def test_replicas_report_concurrently_and_stale_ones_age_out(store: LeaseStore) -> None:
    clock = ManualClock()
    leader, standby = _reporter(store, "coord-a", clock, leading=True), _reporter(store, "coord-b", clock)
    assert leader.report() and standby.report()
    entries, version = read_replicas(store)
    assert [(entry.replica_id, entry.leading, entry.epoch) for entry in entries] == [
        ("coord-a", True, 3), ("coord-b", False, None)]
    assert version == 2 and entries[1].api_url == "http://127.0.0.1:1/coord-b"

    store.put_state(REPLICAS_KEY, {"replicasVersion": 7, "replicas": "[]"})  # someone wrote in between
    leader.note_run(RunSummary(epoch=3, started_at=clock.time(), duration_ms=5.0, leases=0, active_workers=0,
                               expired_leases=0, malformed_rows=0, balanced_this_run=False, plan=None,
                               error="StoreUnavailable: throttled"))
    assert leader.report()  # read-modify-write from the newest version
    entries, version = read_replicas(store)
    assert version == 8 and [entry.replica_id for entry in entries] == ["coord-a"]
    assert entries[0].last_error == "leader run (epoch 3) failed: StoreUnavailable: throttled"

    assert standby.report()
    clock.advance(FORGET_SECONDS + 1)
    assert leader.report()
    assert [entry.replica_id for entry in read_replicas(store)[0]] == ["coord-a"]  # coord-b fell silent long ago


def test_api_lists_replicas_with_age_and_silence(store: LeaseStore) -> None:
    replica = Replica(store)
    reporter = ReplicaReporter(store, "coord-z", replica.clock, lambda: (False, None))
    assert reporter.report()
    replica.clock.advance(3 * KEEPALIVE_SECONDS - 1)
    [entry] = replica.client.get("/v1/replicas").json()["items"]
    assert entry["silent"] is False  # two keep-alives may be late before a replica counts as silent
    replica.clock.advance(2)
    body = replica.client.get("/v1/replicas").json()
    assert body["error"] is None
    [entry] = body["items"]
    assert entry["replica_id"] == "coord-z" and entry["report_age_seconds"] == 3 * KEEPALIVE_SECONDS + 1
    assert entry["silent"] is True
    store.put_state(REPLICAS_KEY, {"replicasVersion": "x", "replicas": "{"})
    assert "CoordinatorReplicas" in replica.client.get("/v1/replicas").json()["error"]


def test_a_killed_leaders_last_report_does_not_show_it_leading(store: LeaseStore) -> None:
    """coord-dead reported itself leading, then died without another report; coord-a holds the lock now."""
    replica = Replica(store)
    replica.join("w1")
    replica.step(1)  # coord-a takes the lock
    dead = ReplicaReporter(store, "coord-dead", replica.clock, lambda: (True, 1))
    assert dead.report()
    alive = ReplicaReporter(store, "coord-a", replica.clock, lambda: (replica.lock.is_leader(), replica.lock.epoch()))
    assert alive.report()
    leading = {entry["replica_id"]: entry["leading"] for entry in replica.client.get("/v1/replicas").json()["items"]}
    assert leading == {"coord-dead": False, "coord-a": True}


def test_a_replica_reports_on_change_and_every_keepalive_reading_the_item_at_half_price(store: LeaseStore) -> None:
    """Issue 17: two replicas reporting every 5 s read 22 units a minute (a consistent read and a write each)."""
    meter = StoreMeter(store)
    clock = ManualClock()
    leading = [False]
    mine = ReplicaReporter(meter, "coord-a", clock, lambda: (leading[0], 4 if leading[0] else None))
    mine.set_api_url("http://127.0.0.1:1/a")
    assert mine.due() and mine.report()
    assert not mine.due()
    clock.advance(KEEPALIVE_SECONDS - 1)
    assert not mine.due()  # nothing changed and no keep-alive is due: no store call
    leading[0] = True
    assert mine.due()  # a new leader shows at once (the run loop checks every second)
    meter.reset()
    assert mine.report() and not mine.due()
    usage = meter.by_caller()["other"]
    assert usage.requests == 2 and usage.read_units == 0.5  # an eventually consistent read, then the write
    [entry] = read_replicas(store)[0]
    assert (entry.replica_id, entry.leading, entry.epoch) == ("coord-a", True, 4)
    mine.note_error("lock tick failed: throttled")
    assert mine.due() and mine.report()
    mine.note_error("lock tick failed: throttled")
    assert not mine.due()  # the same error again is not news (its time goes out with the next keep-alive)
    clock.advance(KEEPALIVE_SECONDS)
    assert mine.due()
    other = _reporter(meter, "coord-b", clock)
    assert other.report() and mine.report()  # each write builds on the other's: neither entry is lost
    assert [entry.replica_id for entry in read_replicas(store)[0]] == ["coord-a", "coord-b"]
