"""Multi-stream lease keys, per-stream shard sync, lease scope, and stream-aware placement."""

from __future__ import annotations

import pytest

from shardherd.coordinator.decide import decide
from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.shard_sync import CreateReason, DeleteReason
from shardherd.coordinator.snapshot import LeaseView, Snapshot
from shardherd.coordinator.stream_sync import Listings, children_waiting, plan_streams_sync, scope_problem
from shardherd.shared.checkpoint import LATEST, SHARD_END, TRIM_HORIZON, Checkpoint
from shardherd.shared.lease import Lease
from shardherd.shared.streams import LeaseAddress, MalformedLeaseKey, StreamIdentifier, parse_lease_key, stream_prefix
from tests.coordinator.test_decide import cpu, owned
from tests.coordinator.test_shard_sync import StreamBuilder, sid

ORDERS = StreamIdentifier("123456789012", "orders", 1700000000)
CLICKS = StreamIdentifier("123456789012", "clicks", 1700000500)


def multi(stream: StreamIdentifier, shard: str, checkpoint: Checkpoint = TRIM_HORIZON, **fields: object) -> Lease:
    """A lease as KCL writes it in multi-stream mode."""
    return Lease(lease_key=stream.lease_key(shard), checkpoint=checkpoint, stream_name=stream.serialized,
                 shard_id=shard, **fields)  # type: ignore[arg-type]


# -- keys ---------------------------------------------------------------------------------------------------------

def test_keys_of_both_formats_parse_and_round_trip() -> None:
    assert parse_lease_key("shardId-000000000042") == LeaseAddress(None, "shardId-000000000042")
    key = "123456789012:orders:1700000000:shardId-000000000007"
    assert parse_lease_key(key, "123456789012:orders:1700000000", "shardId-000000000007") == LeaseAddress(
        ORDERS, "shardId-000000000007")
    assert parse_lease_key(key) == LeaseAddress(ORDERS, "shardId-000000000007")  # attributes are optional
    assert ORDERS.lease_key("shardId-000000000007") == key
    assert StreamIdentifier.parse(ORDERS.serialized) == ORDERS
    assert stream_prefix(key) == ORDERS.serialized and stream_prefix("shardId-000000000001") is None


@pytest.mark.parametrize(("key", "stream", "shard", "problem"), [
    ("orders:1700000000:shardId-1", None, None, "not account:streamName:creationEpoch"),
    ("acct:orders:1700000000:shardId-1", None, None, "account id 'acct'"),
    ("123456789012:orders:yesterday:shardId-1", None, None, "creation epoch 'yesterday'"),
    ("123456789012:ord ers:1:shardId-1", None, None, "stream name 'ord ers'"),
    ("123456789012:orders:1:", None, None, "shard id ''"),
    ("123456789012:orders:1:shardId-1", "123456789012:orders:2", None, "streamName attribute"),
    ("123456789012:orders:1:shardId-1", None, "shardId-2", "shardId attribute"),
    ("shardId-1", "123456789012:orders:1", "shardId-1", "has streamName/shardId attributes"),
    ("shard id with spaces", None, None, "is not a shard id"),
])
def test_malformed_keys_raise_a_typed_error_naming_the_problem(key: str, stream: str | None, shard: str | None,
                                                              problem: str) -> None:
    with pytest.raises(MalformedLeaseKey) as caught:
        parse_lease_key(key, stream, shard)
    assert caught.value.lease_key == key and problem in caught.value.reason
    assert isinstance(caught.value, ValueError)


# -- scope ----------------------------------------------------------------------------------------------------------

def test_scope_keeps_each_application_to_its_own_leases() -> None:
    single = Lease(lease_key=sid(1))
    ours, theirs = multi(ORDERS, sid(1)), multi(CLICKS, sid(1))
    broken = Lease(lease_key="123456789012:orders:x:shardId-1")
    assert scope_problem(single, None) is None
    assert "multi-stream lease" in (scope_problem(ours, None) or "")
    assert scope_problem(ours, {ORDERS}) is None
    assert "not one of the application's streams" in (scope_problem(theirs, {ORDERS}) or "")
    assert "single-stream lease" in (scope_problem(single, {ORDERS}) or "")
    assert "creation epoch" in (scope_problem(broken, {ORDERS}) or "")
    recreated = StreamIdentifier(ORDERS.account_id, ORDERS.name, ORDERS.creation_epoch + 1)
    assert scope_problem(multi(recreated, sid(1)), {ORDERS}) is not None  # another incarnation of the stream


# -- per-stream shard sync -----------------------------------------------------------------------------------------

def _positions(stream: StreamIdentifier | None) -> tuple[str, None]:
    return ("LATEST" if stream == CLICKS else "TRIM_HORIZON"), None


def test_each_stream_is_planned_on_its_own_with_kcl_keys_and_attributes() -> None:
    orders, clicks = StreamBuilder(2), StreamBuilder(1)
    plan = plan_streams_sync({ORDERS: list(orders.shards.values()), CLICKS: list(clicks.shards.values())}, [],
                             _positions).plan
    created = {creation.lease.lease_key: creation.lease for creation in plan.creates}
    assert set(created) == {ORDERS.lease_key(sid(0)), ORDERS.lease_key(sid(1)), CLICKS.lease_key(sid(0))}
    lease = created[ORDERS.lease_key(sid(1))]
    assert lease.stream_name == ORDERS.serialized and lease.shard_id == sid(1) and lease.shard == sid(1)
    assert lease.checkpoint == TRIM_HORIZON and created[CLICKS.lease_key(sid(0))].checkpoint == LATEST
    assert plan.deletes == ()


def test_resharding_one_stream_creates_children_there_and_leaves_the_other_alone() -> None:
    orders, clicks = StreamBuilder(2), StreamBuilder(2)
    a, b = orders.split(0)
    leases = [multi(ORDERS, sid(0), SHARD_END, lease_owner="w1"), multi(ORDERS, sid(1), lease_owner="w2"),
              multi(CLICKS, sid(0), lease_owner="w1"), multi(CLICKS, sid(1), lease_owner="w2")]
    listings: Listings = {ORDERS: list(orders.shards.values()), CLICKS: list(clicks.shards.values())}
    assert children_waiting(listings, leases)
    plan = plan_streams_sync(listings, leases, _positions).plan
    assert {(c.lease.lease_key, c.reason) for c in plan.creates} == {
        (ORDERS.lease_key(sid(a)), CreateReason.PARENTS_FINISHED),
        (ORDERS.lease_key(sid(b)), CreateReason.PARENTS_FINISHED)}
    assert all(c.lease.parent_shard_ids == {sid(0)} for c in plan.creates)
    # Children started: the finished parent is deleted, under its multi-stream key.
    started = [*leases, *(c.lease.with_changes(checkpoint=Checkpoint("5")) for c in plan.creates)]
    assert not children_waiting(listings, started)
    later = plan_streams_sync(listings, started, _positions).plan
    assert [(d.lease.lease_key, d.reason) for d in later.deletes] == [
        (ORDERS.lease_key(sid(0)), DeleteReason.CHILDREN_STARTED)]
    assert later.creates == ()


def test_same_shard_ids_in_two_streams_do_not_mix() -> None:
    orders, clicks = StreamBuilder(1), StreamBuilder(1)
    orders.split(0)  # orders' shardId-0 has children; clicks' shardId-0 is still open
    leases = [multi(ORDERS, sid(0), SHARD_END), multi(CLICKS, sid(0))]
    plan = plan_streams_sync({ORDERS: list(orders.shards.values()), CLICKS: list(clicks.shards.values())}, leases,
                             _positions).plan
    assert {c.lease.lease_key for c in plan.creates} == {ORDERS.lease_key(sid(1)), ORDERS.lease_key(sid(2))}


def test_foreign_and_malformed_rows_are_left_out_and_a_bad_listing_fails_only_its_stream() -> None:
    orders = StreamBuilder(1)
    gone = StreamIdentifier("123456789012", "gone", 1)
    leases = [multi(gone, sid(0)), Lease(lease_key="123456789012:orders:x:" + sid(0)), Lease(lease_key=sid(0))]
    broken = list(StreamBuilder(2).shards.values())[1:]  # leaves a hole in the hash key space
    listings: Listings = {ORDERS: list(orders.shards.values()), CLICKS: broken}
    planned = plan_streams_sync(listings, leases, _positions)
    assert [c.lease.lease_key for c in planned.plan.creates] == [ORDERS.lease_key(sid(0))]
    assert planned.plan.deletes == ()  # nothing outside the listed streams is touched
    assert list(planned.errors) == [CLICKS.serialized] and "hash key space" in planned.errors[CLICKS.serialized]


# -- stream-aware placement ----------------------------------------------------------------------------------------

def test_a_new_lease_goes_to_a_nearly_as_roomy_worker_without_its_stream() -> None:
    # a (CPU 40) already reads two orders shards, b (CPU 41) two clicks shards. A new orders shard: without stream
    # awareness the roomier a takes it (all of orders on one worker); b is within the spread margin and gets it.
    held = [owned(ORDERS.lease_key(sid(0)), "a", 10.0), owned(ORDERS.lease_key(sid(1)), "a", 10.0),
            owned(CLICKS.lease_key(sid(0)), "b", 10.0), owned(CLICKS.lease_key(sid(1)), "b", 10.0)]
    workers = [cpu("a", 40.0), cpu("b", 41.0)]
    plan = decide(Snapshot.of([*held, LeaseView(ORDERS.lease_key(sid(2)))], workers), DeciderConfig(), False)
    assert [(m.lease_key, m.to_worker) for m in plan.moves] == [(ORDERS.lease_key(sid(2)), "b")]
    # Single-stream keys keep the plain most-room rule.
    single = [owned(sid(n), w, 10.0) for n, w in ((0, "a"), (1, "a"), (2, "b"), (3, "b"))]
    plan = decide(Snapshot.of([*single, LeaseView(sid(4))], workers), DeciderConfig(), False)
    assert [(m.lease_key, m.to_worker) for m in plan.moves] == [(sid(4), "a")]
    # A worker far roomier than the others still wins: spreading never overloads.
    plan = decide(Snapshot.of([*held, LeaseView(ORDERS.lease_key(sid(2)))], [cpu("a", 20.0), cpu("b", 60.0)]),
                  DeciderConfig(), False)
    assert [m.to_worker for m in plan.moves] == ["a"]
