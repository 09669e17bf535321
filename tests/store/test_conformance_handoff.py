"""Conformance: the graceful handoff protocol (KCL 3.x's) from start to completion or leader timeout."""

from __future__ import annotations

import pytest

from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.store import Conflict, Fence, LeaseStore
from tests.store.conftest import Leases, expect_applied

KEY = "shardId-000000000000"
OLD, NEW = "worker-a", "worker-b"


def test_full_graceful_handoff(store: LeaseStore, leases: Leases) -> None:
    owned = leases.owned(OLD)

    # 1. The leader starts the handoff: the counter is untouched.
    started = expect_applied(store.start_handoff(KEY, NEW, OLD))
    assert (started.lease_owner, started.checkpoint_owner) == (NEW, OLD)
    assert started.lease_counter == owned.lease_counter
    assert store.list_owned_keys(NEW) == [KEY]
    assert store.list_owned_keys(OLD) == []

    # 2. The old owner's normal renewal fails and shows the handoff; it renews as the draining checkpoint owner.
    plain = store.renew(KEY, OLD, started.lease_counter)
    assert (plain.applied, plain.conflict) == (False, Conflict.OWNERSHIP)
    assert plain.lease is not None and plain.lease.checkpoint_owner == OLD
    renewed = expect_applied(store.renew(KEY, OLD, started.lease_counter, during_handoff=True))
    assert renewed.lease_counter == started.lease_counter + 1
    assert (renewed.lease_owner, renewed.checkpoint_owner) == (NEW, OLD)

    # The new owner can neither renew nor checkpoint while the old one drains.
    for during in (False, True):
        refused = store.renew(KEY, NEW, renewed.lease_counter, during_handoff=during)
        assert (refused.applied, refused.conflict) == (False, Conflict.OWNERSHIP)
    early = store.checkpoint(KEY, NEW, Checkpoint.at("500"))
    assert (early.applied, early.conflict, early.lease) == (False, Conflict.OWNERSHIP, renewed)
    leases.must_be_unchanged(renewed)

    # 3. The old owner checkpoints its final position, then completes the handoff.
    final = expect_applied(store.checkpoint(KEY, OLD, Checkpoint.at("400", 2)))
    assert final.checkpoint == Checkpoint.at("400", 2)
    assert final.lease_counter == renewed.lease_counter + 1
    assert final.owner_switches_since_checkpoint == 0
    completed = expect_applied(store.complete_handoff(KEY, OLD))
    assert (completed.lease_owner, completed.checkpoint_owner) == (NEW, None)
    assert completed.lease_counter == final.lease_counter + 1
    assert completed.owner_switches_since_checkpoint == 1
    assert completed.checkpoint == final.checkpoint

    # After completion the new owner works normally and the old one is out.
    taken_over = expect_applied(store.renew(KEY, NEW, completed.lease_counter))
    progressed = expect_applied(store.checkpoint(KEY, NEW, Checkpoint.at("401")))
    assert progressed.lease_counter == taken_over.lease_counter + 1
    stale_old = store.checkpoint(KEY, OLD, Checkpoint.at("402"))
    assert (stale_old.applied, stale_old.conflict) == (False, Conflict.OWNERSHIP)
    drain_renew = store.renew(KEY, OLD, progressed.lease_counter, during_handoff=True)
    assert (drain_renew.applied, drain_renew.conflict) == (False, Conflict.OWNERSHIP)
    assert store.list_owned_keys(NEW) == [KEY]
    leases.must_be_unchanged(progressed)


def test_final_checkpoint_and_handoff_completion_in_one_write(store: LeaseStore, leases: Leases) -> None:
    started = leases.in_handoff(OLD, NEW)

    refused = store.checkpoint(KEY, NEW, Checkpoint.at("400"), hand_over=True)  # only the checkpoint owner may
    assert (refused.applied, refused.conflict) == (False, Conflict.OWNERSHIP)
    leases.must_be_unchanged(started)

    handed = expect_applied(store.checkpoint(KEY, OLD, Checkpoint.at("400", 2), hand_over=True))
    assert (handed.lease_owner, handed.checkpoint_owner) == (NEW, None)
    assert handed.checkpoint == Checkpoint.at("400", 2)
    assert handed.lease_counter == started.lease_counter + 1
    assert handed.owner_switches_since_checkpoint == 1  # the switch to the new owner since this checkpoint
    assert store.get_lease(KEY) == handed

    late = store.checkpoint(KEY, OLD, Checkpoint.at("401"), hand_over=True)  # the old owner is out
    assert (late.applied, late.conflict) == (False, Conflict.OWNERSHIP)
    expect_applied(store.renew(KEY, NEW, handed.lease_counter))  # the new owner works normally at once


def test_hand_over_without_a_handoff_running_is_a_plain_checkpoint(store: LeaseStore, leases: Leases) -> None:
    owned = leases.owned(OLD)
    plain = expect_applied(store.checkpoint(KEY, OLD, Checkpoint.at("9"), hand_over=True))
    assert (plain.lease_owner, plain.checkpoint_owner) == (OLD, None)
    assert plain.checkpoint == Checkpoint.at("9") and plain.lease_counter == owned.lease_counter + 1
    assert plain.owner_switches_since_checkpoint == 0


def test_leader_reassigns_after_the_handoff_timeout(store: LeaseStore, leases: Leases) -> None:
    started = leases.in_handoff(OLD, NEW)
    forced = expect_applied(store.assign(KEY, NEW, NEW, OLD))
    assert (forced.lease_owner, forced.checkpoint_owner) == (NEW, None)
    assert forced.lease_counter == started.lease_counter + 1

    late_completion = store.complete_handoff(KEY, OLD)
    late_renew = store.renew(KEY, OLD, forced.lease_counter, during_handoff=True)
    late_checkpoint = store.checkpoint(KEY, OLD, Checkpoint.at("7"))
    for outcome in (late_completion, late_renew, late_checkpoint):
        assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.OWNERSHIP, forced)
    leases.must_be_unchanged(forced)
    expect_applied(store.checkpoint(KEY, NEW, Checkpoint.at("7")))


def test_start_handoff_leaves_counter_throughput_and_checkpoint(store: LeaseStore, leases: Leases) -> None:
    owned = leases.owned(OLD)
    renewed = expect_applied(store.renew(KEY, OLD, owned.lease_counter, throughput_kbps=64.0))
    started = expect_applied(store.start_handoff(KEY, NEW, OLD))
    assert started.lease_counter == renewed.lease_counter
    assert started.throughput_kbps == 64.0
    assert started.checkpoint == renewed.checkpoint


@pytest.mark.parametrize("current", ["worker-x", NEW])
def test_start_handoff_from_a_worker_that_is_not_the_owner_is_ownership(store: LeaseStore, leases: Leases,
                                                                        current: str) -> None:
    before = leases.owned(OLD)
    outcome = store.start_handoff(KEY, NEW, current)
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.OWNERSHIP, before)
    leases.must_be_unchanged(before)


def test_start_handoff_while_one_runs_is_ownership(store: LeaseStore, leases: Leases) -> None:
    before = leases.in_handoff(OLD, NEW)
    outcome = store.start_handoff(KEY, "worker-c", NEW)
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.OWNERSHIP, before)
    leases.must_be_unchanged(before)


def test_start_handoff_of_unowned_lease_is_ownership(store: LeaseStore, leases: Leases) -> None:
    before = leases.create()
    outcome = store.start_handoff(KEY, NEW, OLD)
    assert (outcome.applied, outcome.conflict) == (False, Conflict.OWNERSHIP)
    leases.must_be_unchanged(before)


def test_start_handoff_of_missing_lease_is_not_found(store: LeaseStore) -> None:
    outcome = store.start_handoff("shardId-404", NEW, OLD)
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.NOT_FOUND, None)


def test_start_handoff_with_holding_fence(store: LeaseStore, leases: Leases, leader_fence: Fence) -> None:
    leases.owned(OLD)
    started = expect_applied(store.start_handoff(KEY, NEW, OLD, fence=leader_fence))
    assert (started.lease_owner, started.checkpoint_owner) == (NEW, OLD)


def test_start_handoff_with_failed_fence_writes_nothing(store: LeaseStore, leases: Leases,
                                                        lost_fence: Fence) -> None:
    before = leases.owned(OLD)
    outcome = store.start_handoff(KEY, NEW, OLD, fence=lost_fence)
    assert (outcome.applied, outcome.conflict) == (False, Conflict.FENCED)
    leases.must_be_unchanged(before)


@pytest.mark.parametrize("checkpoint_owner", [NEW, "worker-x"])
def test_complete_handoff_by_a_worker_that_is_not_the_checkpoint_owner(store: LeaseStore, leases: Leases,
                                                                       checkpoint_owner: str) -> None:
    before = leases.in_handoff(OLD, NEW)
    outcome = store.complete_handoff(KEY, checkpoint_owner)
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.OWNERSHIP, before)
    leases.must_be_unchanged(before)


def test_complete_handoff_without_a_handoff_is_ownership(store: LeaseStore, leases: Leases) -> None:
    before = leases.owned(OLD)
    outcome = store.complete_handoff(KEY, OLD)
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.OWNERSHIP, before)
    leases.must_be_unchanged(before)


def test_complete_handoff_of_missing_lease_is_not_found(store: LeaseStore) -> None:
    outcome = store.complete_handoff("shardId-404", OLD)
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.NOT_FOUND, None)


def test_normal_renewal_of_the_new_owner_after_completion(store: LeaseStore, leases: Leases) -> None:
    leases.in_handoff(OLD, NEW)
    completed = expect_applied(store.complete_handoff(KEY, OLD))
    stale = store.renew(KEY, OLD, completed.lease_counter)
    assert (stale.applied, stale.conflict) == (False, Conflict.OWNERSHIP)
    renewed = expect_applied(store.renew(KEY, NEW, completed.lease_counter))
    assert renewed.lease_counter == completed.lease_counter + 1
