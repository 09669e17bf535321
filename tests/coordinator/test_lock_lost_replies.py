"""The leader lock when DynamoDB applied a write but its reply never came back (a dropped connection, a timeout).

The store retries the request, and the retry's condition fails on the very write it repeats. Found by CI (stop 48):
a coordinator logged "lost leadership: the lock item changed under us" with no other contender, and its fleet went
without a leader for a lease duration. A FaultyProxy between the store and moto forwards the scheduled request and
then drops the connection (`REPLY_LOST`), as a load balancer or a timed-out read does.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from shardherd.coordinator.leader_lock import OWNER, VERSION, LeaderLock
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.clock import ManualClock
from shardherd.shared.dynamo.store import DynamoLeaseStore
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.store import TableNames
from tests.support.faulty_proxy import DROPPED, REPLY_LOST, FaultyProxy
from tests.support.stores import unique_app

DURATION_MS, PERIOD_MS = 6_000, 1_500


@pytest.fixture
def proxied(moto_server: MotoServer) -> Iterator[tuple[FaultyProxy, DynamoLeaseStore, ManualClock]]:
    clock = ManualClock()
    with FaultyProxy(moto_server.endpoint_url) as proxy:
        store = DynamoLeaseStore(make_client("dynamodb", "us-east-1", proxy.endpoint_url),
                                 TableNames.for_application(unique_app("lostreply")),
                                 retry=RetryPolicy(max_attempts=3, clock=clock, rng=random.Random(3)))
        store.ensure_tables()
        try:
            yield proxy, store, clock
        finally:
            store.close()


def _next_heartbeat(clock: ManualClock) -> None:
    """Advance to the lock's next heartbeat: one period."""
    clock.advance(PERIOD_MS / 1000)


def test_a_heartbeat_applied_whose_reply_was_lost_keeps_the_lead(
        proxied: tuple[FaultyProxy, DynamoLeaseStore, ManualClock]) -> None:
    proxy, store, clock = proxied
    changes: list[bool] = []
    lock = LeaderLock(store, "coord-a", clock, DURATION_MS, PERIOD_MS, on_change=lambda leading, _: changes.append(
        leading))
    assert lock.tick()
    before = store.get_state("Leader")
    proxy.add([REPLY_LOST])  # the heartbeat lands; its retry then finds the version it wrote
    _next_heartbeat(clock)
    assert lock.tick(), "the holder kept its term"
    after = store.get_state("Leader")
    assert after is not None and before is not None and after[VERSION] != before[VERSION]
    assert proxy.faults_served == 1 and proxy.forwarded.count("DynamoDB_20120810.UpdateItem") == 2
    view = lock.own_view()
    assert view is not None and view.version == after[VERSION], "the holder knows the version that landed"
    for _ in range(3):  # later heartbeats are conditioned on it and land
        _next_heartbeat(clock)
        assert lock.tick()
    assert changes == [True]


def test_a_heartbeat_whose_every_reply_was_lost_is_recognised_at_the_next_one(
        proxied: tuple[FaultyProxy, DynamoLeaseStore, ManualClock]) -> None:
    proxy, store, clock = proxied
    lock = LeaderLock(store, "coord-a", clock, DURATION_MS, PERIOD_MS)
    assert lock.tick()
    proxy.add([REPLY_LOST, DROPPED, DROPPED])  # applied, then the retry budget runs out: StoreUnavailable
    _next_heartbeat(clock)
    assert lock.tick(), "an unavailable store leaves the term running"
    landed = store.get_state("Leader")
    assert landed is not None
    _next_heartbeat(clock)  # its condition (the version before) fails on the unanswered heartbeat's version
    assert lock.tick(), "the next heartbeat found the version the unanswered one wrote"
    view = lock.own_view()
    assert view is not None and view.version == landed[VERSION]
    _next_heartbeat(clock)
    assert lock.tick()
    item = store.get_state("Leader")
    assert item is not None and item[OWNER] == "coord-a" and item[VERSION] != landed[VERSION]


def test_a_takeover_applied_whose_reply_was_lost_leads_at_once(
        proxied: tuple[FaultyProxy, DynamoLeaseStore, ManualClock]) -> None:
    proxy, store, clock = proxied
    lock = LeaderLock(store, "coord-a", clock, DURATION_MS, PERIOD_MS)
    # The first acquire: a read of the (absent) item, the epoch counter's read and write, then the lock item's put.
    proxy.add([None, None, None, REPLY_LOST])
    assert lock.tick(), "the put that landed is this contender's term"
    item = store.get_state("Leader")
    assert item is not None and item[OWNER] == "coord-a"
    view = lock.own_view()
    assert view is not None and view.version == item[VERSION] and view.epoch == 1


def test_someone_elses_write_is_still_a_lost_lead(proxied: tuple[FaultyProxy, DynamoLeaseStore, ManualClock]) -> None:
    proxy, store, clock = proxied
    lock = LeaderLock(store, "coord-a", clock, DURATION_MS, PERIOD_MS)
    assert lock.tick()
    store.put_state("Leader", {OWNER: "intruder", "leaseDuration": "6000", VERSION: "v-intruder"})
    proxy.add([DROPPED])  # the heartbeat never reaches the server, its retry finds the intruder's version
    _next_heartbeat(clock)
    assert not lock.tick()
