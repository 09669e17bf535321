"""Pause, its acknowledgement and the fenced checkpoint rewrite behave alike on every backend (shared/pause.py)."""

from __future__ import annotations

from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.store import Conflict, LeaseStore
from tests.store.conftest import Leases, expect_applied

KEY = "shardId-000000000000"


def test_pause_and_resume_leave_owner_and_counter_alone(store: LeaseStore) -> None:
    owned = Leases(store).owned("w1", checkpoint=Checkpoint.at("100"))
    paused = expect_applied(store.set_pause(KEY, "bad deploy"))
    assert paused.paused == "bad deploy" and paused.paused_by is None
    assert (paused.lease_owner, paused.lease_counter, paused.checkpoint) == ("w1", owned.lease_counter,
                                                                              Checkpoint.at("100"))
    assert store.renew(KEY, "w1", owned.lease_counter).applied  # a renewing owner is not disturbed
    acked = expect_applied(store.acknowledge_pause(KEY, "w1"))
    assert acked.pause_acknowledged
    reread = store.get_lease(KEY)
    assert reread is not None and reread.paused == "bad deploy" and reread.paused_by == "w1"
    resumed = expect_applied(store.set_pause(KEY, None))
    assert resumed.paused is None and resumed.paused_by is None and not resumed.is_paused


def test_only_the_processing_worker_acknowledges_and_only_while_paused(store: LeaseStore) -> None:
    Leases(store).owned("w1")
    assert store.acknowledge_pause(KEY, "w1").conflict is Conflict.OWNERSHIP  # not paused
    expect_applied(store.set_pause(KEY, "x"))
    assert store.acknowledge_pause(KEY, "w2").conflict is Conflict.OWNERSHIP
    assert store.set_pause("shardId-missing", "x").conflict is Conflict.NOT_FOUND


def test_rewrite_moves_a_paused_checkpoint_backwards_fenced_on_the_row(store: LeaseStore) -> None:
    Leases(store).owned("w1", checkpoint=Checkpoint.at("900"))
    expect_applied(store.set_pause(KEY, "rewind"))
    acked = expect_applied(store.acknowledge_pause(KEY, "w1"))
    rewound = expect_applied(store.rewrite_checkpoint(KEY, acked, Checkpoint.at("300", 2)))
    assert rewound.checkpoint == Checkpoint.at("300", 2) and rewound.lease_counter == acked.lease_counter + 1
    assert rewound.lease_owner == "w1" and rewound.is_paused
    # The row moved on since `acked` was read: the second rewrite is refused and writes nothing.
    assert store.rewrite_checkpoint(KEY, acked, Checkpoint.at("1")).conflict is Conflict.OWNERSHIP
    after = store.get_lease(KEY)
    assert after is not None and after.checkpoint == Checkpoint.at("300", 2)


def test_rewrite_is_refused_on_a_running_lease(store: LeaseStore) -> None:
    owned = Leases(store).owned("w1", checkpoint=Checkpoint.at("900"))
    assert store.rewrite_checkpoint(KEY, owned, Checkpoint.at("1")).conflict is Conflict.OWNERSHIP
    after = store.get_lease(KEY)
    assert after is not None and after.checkpoint == Checkpoint.at("900")
