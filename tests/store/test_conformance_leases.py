"""Conformance: create, read, renew, assign, release, delete, owner query and scan."""

from __future__ import annotations

import pytest

from shardherd.shared.checkpoint import SHARD_END, TRIM_HORIZON, Checkpoint
from shardherd.shared.errors import MalformedLease
from shardherd.shared.lease import Lease
from shardherd.shared.store import Conflict, Fence, LeaseStore
from tests.store.conftest import Leases, RawTable, expect_applied

KEY = "shardId-000000000000"
MISSING = "shardId-999999999999"


def full_lease() -> Lease:
    """A lease with every optional field filled in (a merged child of two parents, mid-stream)."""
    return Lease(
        lease_key="app:stream:1700000000:shardId-000000000007",
        lease_owner="worker-a",
        checkpoint=Checkpoint.at("49590338271490256608559692538361571095921575989136588898", 3),
        owner_switches_since_checkpoint=2,
        pending_checkpoint=Checkpoint.at("49590338271490256608559692538361571095921575989136588999", 1),
        pending_checkpoint_state=b"\x00\xffstate",
        parent_shard_ids=frozenset({"shardId-000000000003", "shardId-000000000004"}),
        child_shard_ids=frozenset({"shardId-000000000009"}),
        starting_hash_key="0",
        ending_hash_key="340282366920938463463374607431768211455",
        throughput_kbps=12.5,
        stream_name="app:stream:1700000000",
        shard_id="shardId-000000000007",
        last_move='{"e":1,"t":1700000000.5,"r":"UNASSIGNED","d":"","f":null,"w":"worker-a"}',
    )


# ------------------------------------------------------------------------------------------------ create / get
def test_create_stores_every_field_and_get_reads_it_back(store: LeaseStore) -> None:
    lease = full_lease()
    created = expect_applied(store.create_lease(lease))
    assert created == lease
    assert store.get_lease(lease.lease_key) == lease


def test_create_minimal_lease_has_counter_zero_and_no_owner(store: LeaseStore) -> None:
    created = expect_applied(store.create_lease(Lease(lease_key=KEY)))
    assert (created.lease_owner, created.lease_counter, created.checkpoint) == (None, 0, TRIM_HORIZON)
    assert created.parent_shard_ids == frozenset() and created.child_shard_ids == frozenset()
    assert store.get_lease(KEY) == created


def test_create_existing_key_is_already_exists_and_keeps_the_row(store: LeaseStore, leases: Leases) -> None:
    first = leases.owned("worker-a")
    outcome = store.create_lease(Lease(lease_key=KEY, lease_owner="intruder", checkpoint=SHARD_END))
    assert not outcome.applied
    assert outcome.conflict is Conflict.ALREADY_EXISTS
    assert outcome.lease == first
    leases.must_be_unchanged(first)


def test_get_missing_lease_is_none(store: LeaseStore) -> None:
    assert store.get_lease(MISSING) is None


# ------------------------------------------------------------------------------------------------ renew
def test_renew_by_owner_bumps_counter_and_sets_throughput(store: LeaseStore, leases: Leases) -> None:
    before = leases.owned("worker-a")
    after = expect_applied(store.renew(KEY, "worker-a", before.lease_counter, throughput_kbps=1.23456789))
    assert after.lease_counter == before.lease_counter + 1
    assert after.lease_owner == "worker-a"
    assert after.throughput_kbps == pytest.approx(1.234568, abs=1e-9)
    assert store.get_lease(KEY) == after


def test_renew_without_throughput_keeps_the_stored_value(store: LeaseStore, leases: Leases) -> None:
    before = leases.owned("worker-a")
    first = expect_applied(store.renew(KEY, "worker-a", before.lease_counter, throughput_kbps=40.0))
    second = expect_applied(store.renew(KEY, "worker-a", first.lease_counter))
    assert second.throughput_kbps == 40.0
    assert second.lease_counter == before.lease_counter + 2


@pytest.mark.parametrize(("owner", "counter_offset"), [("worker-b", 0), ("worker-a", -1), ("worker-a", 1)])
def test_renew_with_wrong_owner_or_counter_is_ownership(store: LeaseStore, leases: Leases, owner: str,
                                                        counter_offset: int) -> None:
    before = leases.owned("worker-a")
    outcome = store.renew(KEY, owner, before.lease_counter + counter_offset)
    assert not outcome.applied
    assert outcome.conflict is Conflict.OWNERSHIP
    assert outcome.lease == before
    leases.must_be_unchanged(before)


def test_renew_missing_lease_is_not_found(store: LeaseStore) -> None:
    outcome = store.renew(MISSING, "worker-a", 0)
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.NOT_FOUND, None)


def test_renew_of_unowned_lease_is_ownership(store: LeaseStore, leases: Leases) -> None:
    before = leases.create()
    outcome = store.renew(KEY, "worker-a", 0)
    assert (outcome.applied, outcome.conflict) == (False, Conflict.OWNERSHIP)
    leases.must_be_unchanged(before)


# ------------------------------------------------------------------------------------------------ assign
def test_assign_unowned_lease_sets_owner_without_a_switch(store: LeaseStore, leases: Leases) -> None:
    before = leases.create()
    after = expect_applied(store.assign(KEY, "worker-a", None, None))
    assert after.lease_owner == "worker-a"
    assert after.lease_counter == before.lease_counter + 1
    assert after.owner_switches_since_checkpoint == 0


def test_assign_to_another_worker_counts_a_switch(store: LeaseStore, leases: Leases) -> None:
    before = leases.owned("worker-a")
    after = expect_applied(store.assign(KEY, "worker-b", "worker-a", None))
    assert after.lease_owner == "worker-b"
    assert after.lease_counter == before.lease_counter + 1
    assert after.owner_switches_since_checkpoint == before.owner_switches_since_checkpoint + 1


def test_assign_to_the_same_owner_counts_no_switch(store: LeaseStore, leases: Leases) -> None:
    before = leases.owned("worker-a")
    after = expect_applied(store.assign(KEY, "worker-a", "worker-a", None))
    assert after.owner_switches_since_checkpoint == before.owner_switches_since_checkpoint
    assert after.lease_counter == before.lease_counter + 1


def test_assign_is_not_conditioned_on_the_counter(store: LeaseStore, leases: Leases) -> None:
    before = leases.owned("worker-a")
    renewed = expect_applied(store.renew(KEY, "worker-a", before.lease_counter))
    after = expect_applied(store.assign(KEY, "worker-b", "worker-a", None))
    assert after.lease_counter == renewed.lease_counter + 1
    stale = store.renew(KEY, "worker-a", renewed.lease_counter)
    assert (stale.applied, stale.conflict) == (False, Conflict.OWNERSHIP)


def test_assign_during_handoff_to_a_third_worker(store: LeaseStore, leases: Leases) -> None:
    before = leases.in_handoff("worker-a", "worker-b")
    after = expect_applied(store.assign(KEY, "worker-c", "worker-b", "worker-a"))
    assert (after.lease_owner, after.checkpoint_owner) == ("worker-c", None)
    assert after.lease_counter == before.lease_counter + 1
    assert after.owner_switches_since_checkpoint == before.owner_switches_since_checkpoint + 1


def test_assign_back_to_the_checkpoint_owner_counts_one_switch(store: LeaseStore, leases: Leases) -> None:
    before = leases.in_handoff("worker-a", "worker-b")
    after = expect_applied(store.assign(KEY, "worker-a", "worker-b", "worker-a"))
    assert (after.lease_owner, after.checkpoint_owner) == ("worker-a", None)
    assert after.owner_switches_since_checkpoint == before.owner_switches_since_checkpoint + 1


def test_the_move_record_rides_on_the_owner_write_and_goes_with_an_unrecorded_one(store: LeaseStore,
                                                                                  leases: Leases,
                                                                                  leader_fence: Fence) -> None:
    leases.owned("worker-a")
    handed = expect_applied(store.start_handoff(KEY, "worker-b", "worker-a", fence=leader_fence, move="to b"))
    assert handed.last_move == "to b" and store.get_lease(KEY) == handed
    assigned = expect_applied(store.assign(KEY, "worker-c", "worker-b", "worker-a", fence=leader_fence, move="to c"))
    assert assigned.last_move == "to c" and store.scan_leases().leases == [assigned]
    plain = expect_applied(store.assign(KEY, "worker-a", "worker-c", None))
    assert plain.last_move is None and store.get_lease(KEY) == plain


@pytest.mark.parametrize(
    ("expected_owner", "expected_checkpoint_owner", "set_up"),
    [
        ("worker-x", None, "owned"),  # owner differs
        (None, None, "owned"),  # expects unowned, row is owned
        ("worker-a", None, "handoff"),  # expects no handoff, one is running (owner is worker-b)
        ("worker-b", None, "handoff"),  # right owner, but checkpointOwner is set
        ("worker-b", "worker-x", "handoff"),  # wrong checkpoint owner
        ("worker-a", "worker-a", "owned"),  # expects a handoff that is not running
    ],
)
def test_assign_with_unmet_owner_conditions_is_ownership(store: LeaseStore, leases: Leases,
                                                         expected_owner: str | None,
                                                         expected_checkpoint_owner: str | None,
                                                         set_up: str) -> None:
    before = leases.owned("worker-a") if set_up == "owned" else leases.in_handoff("worker-a", "worker-b")
    outcome = store.assign(KEY, "worker-c", expected_owner, expected_checkpoint_owner)
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.OWNERSHIP, before)
    leases.must_be_unchanged(before)


def test_assign_missing_lease_is_not_found(store: LeaseStore) -> None:
    outcome = store.assign(MISSING, "worker-a", None, None)
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.NOT_FOUND, None)


# ------------------------------------------------------------------------------------------------ fences
def test_assign_with_holding_fence_is_applied(store: LeaseStore, leases: Leases, leader_fence: Fence) -> None:
    leases.owned("worker-a")
    after = expect_applied(store.assign(KEY, "worker-b", "worker-a", None, fence=leader_fence))
    assert after.lease_owner == "worker-b"


def test_assign_with_failed_fence_is_fenced_and_writes_nothing(store: LeaseStore, leases: Leases,
                                                              lost_fence: Fence) -> None:
    before = leases.owned("worker-a")
    outcome = store.assign(KEY, "worker-b", "worker-a", None, fence=lost_fence)
    assert (outcome.applied, outcome.conflict) == (False, Conflict.FENCED)
    leases.must_be_unchanged(before)


def test_fence_is_checked_before_existence(store: LeaseStore, lost_fence: Fence) -> None:
    outcome = store.assign(MISSING, "worker-b", None, None, fence=lost_fence)
    assert (outcome.applied, outcome.conflict) == (False, Conflict.FENCED)
    assert store.get_lease(MISSING) is None


def test_holding_fence_on_missing_lease_is_not_found(store: LeaseStore, leader_fence: Fence) -> None:
    outcome = store.assign(MISSING, "worker-b", None, None, fence=leader_fence)
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.NOT_FOUND, None)


def test_fence_on_absent_state_item(store: LeaseStore, leases: Leases) -> None:
    leases.create()
    absent = Fence("no-such-lock", {"key": None})
    expect_applied(store.assign(KEY, "worker-a", None, None, fence=absent))
    present = Fence("no-such-lock", {"ownerName": "leader-1"})
    outcome = store.assign(KEY, "worker-b", "worker-a", None, fence=present)
    assert (outcome.applied, outcome.conflict) == (False, Conflict.FENCED)


def test_fence_with_absent_attribute_condition(store: LeaseStore, leases: Leases, leader_fence: Fence) -> None:
    leases.owned("worker-a")
    no_release = Fence(leader_fence.key, {**leader_fence.expect, "released": None})
    expect_applied(store.assign(KEY, "worker-b", "worker-a", None, fence=no_release))
    assert store.update_state(leader_fence.key, {"released": "yes"})
    outcome = store.assign(KEY, "worker-c", "worker-b", None, fence=no_release)
    assert (outcome.applied, outcome.conflict) == (False, Conflict.FENCED)


def test_delete_honours_the_fence(store: LeaseStore, leases: Leases, lost_fence: Fence) -> None:
    before = leases.owned("worker-a")
    deleted = store.delete_lease(KEY, fence=lost_fence)
    assert (deleted.applied, deleted.conflict) == (False, Conflict.FENCED)
    leases.must_be_unchanged(before)


# ------------------------------------------------------------------------------------------------ release
def test_release_removes_the_owner_and_bumps_counter(store: LeaseStore, leases: Leases) -> None:
    before = leases.owned("worker-a")
    after = expect_applied(store.release(KEY, "worker-a"))
    assert after.lease_owner is None
    assert after.lease_counter == before.lease_counter + 1
    assert store.get_lease(KEY) == after


def test_release_by_another_worker_is_ownership(store: LeaseStore, leases: Leases) -> None:
    before = leases.owned("worker-a")
    outcome = store.release(KEY, "worker-b")
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.OWNERSHIP, before)
    leases.must_be_unchanged(before)


def test_release_during_handoff_is_ownership(store: LeaseStore, leases: Leases) -> None:
    before = leases.in_handoff("worker-a", "worker-b")
    for worker in ("worker-a", "worker-b"):
        outcome = store.release(KEY, worker)
        assert (outcome.applied, outcome.conflict) == (False, Conflict.OWNERSHIP)
    leases.must_be_unchanged(before)


def test_release_missing_lease_is_not_found(store: LeaseStore) -> None:
    outcome = store.release(MISSING, "worker-a")
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.NOT_FOUND, None)


# ------------------------------------------------------------------------------------------------ delete
def test_delete_returns_the_deleted_row(store: LeaseStore, leases: Leases, leader_fence: Fence) -> None:
    before = leases.owned("worker-a")
    outcome = store.delete_lease(KEY, fence=leader_fence)
    assert (outcome.applied, outcome.lease) == (True, before)
    assert store.get_lease(KEY) is None


def test_delete_with_matching_checkpoint(store: LeaseStore, leases: Leases) -> None:
    leases.owned("worker-a")
    finished = expect_applied(store.checkpoint(KEY, "worker-a", SHARD_END))
    outcome = store.delete_lease(KEY, expected_checkpoint=SHARD_END)
    assert (outcome.applied, outcome.lease) == (True, finished)
    assert store.get_lease(KEY) is None


@pytest.mark.parametrize("expected", [SHARD_END, Checkpoint.at("100", 0), Checkpoint.at("100", 2)])
def test_delete_with_different_checkpoint_is_stale(store: LeaseStore, leases: Leases,
                                                   expected: Checkpoint) -> None:
    leases.owned("worker-a")
    before = expect_applied(store.checkpoint(KEY, "worker-a", Checkpoint.at("100", 1)))
    outcome = store.delete_lease(KEY, expected_checkpoint=expected)
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.STALE_CHECKPOINT, before)
    leases.must_be_unchanged(before)


def test_delete_missing_lease_is_not_found(store: LeaseStore) -> None:
    outcome = store.delete_lease(MISSING)
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.NOT_FOUND, None)


# ------------------------------------------------------------------------------------------------ owner query
def test_list_owned_keys_follows_assignment_changes(store: LeaseStore, leases: Leases) -> None:
    keys = [f"shardId-{i:012d}" for i in range(6)]
    for index, key in enumerate(keys):
        leases.owned("worker-a" if index % 2 == 0 else "worker-b", key)
    assert sorted(store.list_owned_keys("worker-a")) == keys[0::2]
    assert sorted(store.list_owned_keys("worker-b")) == keys[1::2]

    expect_applied(store.assign(keys[0], "worker-b", "worker-a", None))
    expect_applied(store.release(keys[2], "worker-a"))
    expect_applied(store.start_handoff(keys[4], "worker-c", "worker-a"))
    assert store.list_owned_keys("worker-a") == []
    assert sorted(store.list_owned_keys("worker-b")) == sorted([keys[0], *keys[1::2]])
    assert store.list_owned_keys("worker-c") == [keys[4]]

    expect_applied(store.delete_lease(keys[1]))
    assert sorted(store.list_owned_keys("worker-b")) == [keys[0], keys[3], keys[5]]


def test_list_owned_keys_of_unknown_worker_is_empty(store: LeaseStore, leases: Leases) -> None:
    leases.owned("worker-a")
    assert store.list_owned_keys("nobody") == []


# ------------------------------------------------------------------------------------------------ scan
def test_scan_of_empty_table_is_empty(store: LeaseStore) -> None:
    scan = store.scan_leases(page_size=5)
    assert (scan.leases, scan.malformed) == ([], [])


@pytest.mark.parametrize("page_size", [1, 7, 1000])
def test_scan_returns_every_lease_exactly_once_with_any_page_size(store: LeaseStore, leases: Leases,
                                                                  page_size: int) -> None:
    created = {}
    for index in range(23):
        key = f"shardId-{index:012d}"
        created[key] = leases.owned(f"worker-{index % 3}", key) if index % 4 else leases.create(key)
    scan = store.scan_leases(page_size=page_size)
    assert scan.malformed == []
    assert len(scan.leases) == len(created)
    assert {lease.lease_key: lease for lease in scan.leases} == created


# ------------------------------------------------------------------------------------------------ foreign rows
def test_kcl_row_without_entity_type_is_read_and_continued(store: LeaseStore, raw_table: RawTable) -> None:
    raw_table.put({"leaseKey": KEY, "leaseOwner": "kcl-worker", "leaseCounter": 41, "checkpoint": "4959033827",
                   "checkpointSubSequenceNumber": 2, "ownerSwitchesSinceCheckpoint": 1})
    read = store.get_lease(KEY)
    assert read == Lease(lease_key=KEY, lease_owner="kcl-worker", lease_counter=41,
                         checkpoint=Checkpoint.at("4959033827", 2), owner_switches_since_checkpoint=1)
    renewed = expect_applied(store.renew(KEY, "kcl-worker", 41))
    assert renewed.lease_counter == 42
    progressed = expect_applied(store.checkpoint(KEY, "kcl-worker", Checkpoint.at("4959033828")))
    assert progressed.owner_switches_since_checkpoint == 0


def test_malformed_row_is_reported_with_its_key_and_left_untouched(store: LeaseStore, leases: Leases,
                                                                   raw_table: RawTable) -> None:
    good = leases.owned("worker-a")
    raw_table.put({"leaseKey": "shardId-bad", "leaseCounter": 3, "checkpoint": "not-a-sequence-number"})
    planted = raw_table.get("shardId-bad")
    with pytest.raises(MalformedLease) as caught:
        store.get_lease("shardId-bad")
    assert caught.value.lease_key == "shardId-bad"
    scan = store.scan_leases(page_size=1)
    assert scan.leases == [good]
    assert [bad.lease_key for bad in scan.malformed] == ["shardId-bad"]
    assert raw_table.get("shardId-bad") == planted


def test_non_lease_entities_are_skipped_silently(store: LeaseStore, leases: Leases, raw_table: RawTable) -> None:
    good = leases.owned("worker-a")
    raw_table.put({"leaseKey": "worker-a", "leaseCounter": 0, "entityType": "WORKER_METRICS"})
    raw_table.put({"leaseKey": "leader-lock", "leaseCounter": 0, "entityType": "LOCK"})
    assert store.get_lease("worker-a") is None
    scan = store.scan_leases(page_size=2)
    assert (scan.leases, scan.malformed) == ([good], [])
    assert raw_table.get("worker-a") is not None
