"""The keeper follows a pause in its lease rows: stops, acknowledges, keeps the lease, resumes; new owners wait."""

from __future__ import annotations

import pytest

from shardherd.agent.lease_keeper import HeldState, LossReason
from shardherd.shared.assignment_channel import OWNS, PAUSED_MARK
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.clock import ManualClock
from shardherd.shared.lease import Lease
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.pause import BadControlRequest, select_leases
from shardherd.shared.store import TableNames
from tests.agent.test_lease_keeper import KEY, _holding, _keeper, _step


def _store() -> MemoryLeaseStore:
    return MemoryLeaseStore(TableNames.for_application("pause-test"))


def test_a_pause_seen_in_a_checkpoint_reply_stops_acknowledges_and_keeps_the_lease() -> None:
    clock, store = ManualClock(), _store()
    keeper, events = _holding(store, "w1", clock)
    assert store.set_pause(KEY, "bad deploy").applied
    assert keeper.checkpoint(KEY, Checkpoint.at("10")).applied  # the reply shows the pause
    assert events.handoffs == [KEY]  # stop after the batch in hand, checkpoint
    assert keeper.checkpoint(KEY, Checkpoint.at("12")).applied  # its final checkpoint is accepted
    keeper.finish_handoff(KEY)
    assert events.lost == [(KEY, LossReason.PAUSED)]
    row = store.get_lease(KEY)
    assert row is not None and row.lease_owner == "w1" and row.paused_by == "w1" and row.pause_acknowledged
    _step(clock, 10, keeper)  # heartbeats go on; nothing is lost or restarted
    assert KEY in keeper.held() and dict(keeper.held_items())[KEY].state is HeldState.PAUSED
    assert events.acquired == [KEY]
    assert store.set_pause(KEY, None).applied
    _step(clock, 2.5, keeper)  # a discovery re-reads the paused lease and sees the resume
    assert events.acquired == [KEY, KEY]
    assert dict(keeper.held_items())[KEY].state is HeldState.PROCESSING


def test_a_new_owner_of_a_paused_lease_stays_paused() -> None:
    clock, store = ManualClock(), _store()
    _holding(store, "w1", clock)
    assert store.set_pause(KEY, "hold").applied
    assert store.assign(KEY, "w2", "w1", None).applied  # failover after w1 died
    other, other_events = _keeper(store, "w2", clock)
    _step(clock, 2.5, other)
    assert other_events.acquired == [] and KEY in other.held()
    row = store.get_lease(KEY)
    assert row is not None and row.paused_by == "w2" and row.pause_acknowledged


def test_the_channel_mark_makes_the_owner_read_the_row() -> None:
    clock, store = ManualClock(), _store()
    keeper, events = _holding(store, "w1", clock)
    assert store.set_pause(KEY, "hold").applied
    keeper.tell({KEY: OWNS + PAUSED_MARK})
    keeper.tick()
    assert events.handoffs == [KEY]


def test_a_request_names_shards_or_every_shard_of_a_stream() -> None:
    leases = [Lease(lease_key=f"123456789012:{stream}:1700000000:shardId-00000000000{i}") for stream in ("a", "b")
              for i in range(2)]
    assert [lease.lease_key for lease in select_leases(leases, streams=["b"])] == [
        "123456789012:b:1700000000:shardId-000000000000", "123456789012:b:1700000000:shardId-000000000001"]
    assert len(select_leases(leases, shards=["shardId-000000000001"])) == 2  # that shard id in both streams
    for shards, streams, said in (([], [], "at least one"), (["shardId-9"], [], "no lease for shard"),
                                  ([], ["c"], "no lease of stream 'c'")):
        with pytest.raises(BadControlRequest, match=said):
            select_leases(leases, shards, streams)
