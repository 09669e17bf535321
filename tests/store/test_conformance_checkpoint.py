"""Conformance: checkpoints are monotonic, numeric, sub-sequence aware, final at SHARD_END and owner-only."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardherd.shared.checkpoint import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint
from shardherd.shared.lease import Lease
from shardherd.shared.store import Conflict, LeaseStore, Outcome
from shardherd.shared.worker import LeaseProgress
from tests.store.conftest import Leases, expect_applied

KEY = "shardId-000000000000"
OWNER = "worker-a"
LONGEST = "9" * 129  # the largest sequence number KCL accepts (129 digits)


def test_owner_checkpoint_is_stored_bumps_counter_and_resets_switches(store: LeaseStore,
                                                                        leases: Leases) -> None:
    leases.owned("worker-x")
    moved = expect_applied(store.assign(KEY, OWNER, "worker-x", None))
    assert moved.owner_switches_since_checkpoint == 1
    after = expect_applied(store.checkpoint(KEY, OWNER, Checkpoint.at("12345", 6)))
    assert after.checkpoint == Checkpoint.at("12345", 6)
    assert after.owner_switches_since_checkpoint == 0
    assert after.lease_counter == moved.lease_counter + 1
    assert after.lease_owner == OWNER
    assert store.get_lease(KEY) == after


def test_checkpoint_carries_the_owners_progress_and_later_writes_keep_it(store: LeaseStore, leases: Leases) -> None:
    leases.owned(OWNER)
    first = expect_applied(store.checkpoint(KEY, OWNER, Checkpoint.at("10"),
                                            progress=LeaseProgress(1_500, 7, 2**40, records_behind=12)))
    assert (first.millis_behind_latest, first.records_processed, first.bytes_processed) == (1_500, 7, 2**40)
    assert first.records_behind == 12
    assert store.get_lease(KEY) == first
    # Without progress a checkpoint leaves the stored figures as they are; an unknown lag removes the stored one.
    kept = expect_applied(store.checkpoint(KEY, OWNER, Checkpoint.at("11")))
    assert (kept.millis_behind_latest, kept.records_processed, kept.bytes_processed) == (1_500, 7, 2**40)
    cleared = expect_applied(store.checkpoint(KEY, OWNER, Checkpoint.at("12"), progress=LeaseProgress(None, 9, 80)))
    assert (cleared.millis_behind_latest, cleared.records_processed, cleared.bytes_processed) == (None, 9, 80)
    assert cleared.records_behind is None  # an unknown count removes the stored one, like the lag
    moved = expect_applied(store.assign(KEY, "worker-b", OWNER, None))
    assert (moved.records_processed, store.get_lease(KEY)) == (9, moved)
    refused = store.checkpoint(KEY, OWNER, Checkpoint.at("13"), progress=LeaseProgress(0, 99, 99))
    assert not refused.applied and expect_lease(store).records_processed == 9


def expect_lease(store: LeaseStore) -> Lease:
    """The stored lease KEY (it must exist)."""
    lease = store.get_lease(KEY)
    assert lease is not None
    return lease


@pytest.mark.parametrize("initial", [TRIM_HORIZON, LATEST, AT_TIMESTAMP])
def test_first_sequence_number_follows_any_initial_sentinel(store: LeaseStore, leases: Leases,
                                                            initial: Checkpoint) -> None:
    leases.owned(OWNER, checkpoint=initial)
    after = expect_applied(store.checkpoint(KEY, OWNER, Checkpoint.at("1")))
    assert after.checkpoint == Checkpoint.at("1")


@pytest.mark.parametrize(
    ("stored", "attempt"),
    [
        (Checkpoint.at("100"), Checkpoint.at("99")),  # numeric, not lexicographic ("99" > "100" as strings)
        (Checkpoint.at("100", 5), Checkpoint.at("100", 4)),  # sub-sequence breaks the tie
        (Checkpoint.at("100", 5), Checkpoint.at("100")),
        (Checkpoint.at(LONGEST), Checkpoint.at("9" * 128)),  # 129 digits vs 128 digits
        (Checkpoint.at(10**128), Checkpoint.at(10**128 - 1)),
        (Checkpoint.at("5"), TRIM_HORIZON),  # back to an initial sentinel
        (Checkpoint.at("5"), LATEST),
        (SHARD_END, Checkpoint.at(LONGEST)),  # nothing follows SHARD_END
        (SHARD_END, TRIM_HORIZON),
    ],
)
def test_regressing_checkpoint_is_stale_and_writes_nothing(store: LeaseStore, leases: Leases,
                                                           stored: Checkpoint, attempt: Checkpoint) -> None:
    leases.owned(OWNER)
    before = expect_applied(store.checkpoint(KEY, OWNER, stored))
    outcome = store.checkpoint(KEY, OWNER, attempt)
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.STALE_CHECKPOINT, before)
    leases.must_be_unchanged(before)


@pytest.mark.parametrize(
    ("stored", "attempt"),
    [
        (Checkpoint.at("99"), Checkpoint.at("100")),
        (Checkpoint.at("100", 4), Checkpoint.at("100", 5)),
        (Checkpoint.at("100", 9), Checkpoint.at("101")),
        (Checkpoint.at("9" * 128), Checkpoint.at(10**128)),
        (Checkpoint.at("9" * 128), Checkpoint.at(LONGEST, 3)),
        (Checkpoint.at("100", 5), Checkpoint.at("100", 5)),  # equal is not a regression
        (Checkpoint.at(LONGEST), SHARD_END),
        (SHARD_END, SHARD_END),
    ],
)
def test_advancing_checkpoint_is_applied(store: LeaseStore, leases: Leases, stored: Checkpoint,
                                         attempt: Checkpoint) -> None:
    leases.owned(OWNER)
    before = expect_applied(store.checkpoint(KEY, OWNER, stored))
    after = expect_applied(store.checkpoint(KEY, OWNER, attempt))
    assert after.checkpoint == attempt
    assert after.checkpoint.sequence_number == attempt.sequence_number
    assert after.lease_counter == before.lease_counter + 1
    assert store.get_lease(KEY) == after


def test_checkpoint_by_a_non_owner_is_ownership(store: LeaseStore, leases: Leases) -> None:
    before = leases.owned(OWNER)
    outcome = store.checkpoint(KEY, "worker-x", Checkpoint.at("1"))
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.OWNERSHIP, before)
    leases.must_be_unchanged(before)


def test_checkpoint_of_unowned_lease_is_ownership(store: LeaseStore, leases: Leases) -> None:
    before = leases.create()
    outcome = store.checkpoint(KEY, OWNER, Checkpoint.at("1"))
    assert (outcome.applied, outcome.conflict) == (False, Conflict.OWNERSHIP)
    leases.must_be_unchanged(before)


def test_checkpoint_of_missing_lease_is_not_found(store: LeaseStore) -> None:
    outcome = store.checkpoint("shardId-404", OWNER, Checkpoint.at("1"))
    assert (outcome.applied, outcome.conflict, outcome.lease) == (False, Conflict.NOT_FOUND, None)


def test_a_kcl_workers_pending_checkpoint_is_kept_by_every_write_but_a_checkpoint(store: LeaseStore) -> None:
    """A KCL worker's two-phase checkpoint survives renewals, handoffs, assignments and releases; a checkpoint ends it.

    shardherd never prepares a checkpoint, but a KCL worker in a mixed fleet may have: losing its prepared position
    or state on an unrelated write would lose what that worker's application stored there. KCL's own checkpoint
    removes all three attributes, and so does ours.
    """
    pending, state = Checkpoint.at("20", 1), b"\x00\x01app-state\xff"
    expect_applied(store.create_lease(Lease(KEY, lease_owner="kcl-worker", checkpoint=Checkpoint.at("10"),
                                            pending_checkpoint=pending, pending_checkpoint_state=state)))
    writes: list[Callable[[int], Outcome]] = [
        lambda counter: store.renew(KEY, "kcl-worker", counter, throughput_kbps=3.0),
        lambda counter: store.start_handoff(KEY, OWNER, "kcl-worker"),
        lambda counter: store.renew(KEY, "kcl-worker", counter, during_handoff=True),
        lambda counter: store.complete_handoff(KEY, "kcl-worker"),
        lambda counter: store.assign(KEY, "worker-b", OWNER, None),
        lambda counter: store.release(KEY, "worker-b"),
        lambda counter: store.assign(KEY, OWNER, None, None),
    ]
    counter = 0
    for write in writes:
        row = expect_applied(write(counter))
        assert (row.pending_checkpoint, row.pending_checkpoint_state) == (pending, state)
        counter = row.lease_counter
    stored = store.get_lease(KEY)
    assert stored is not None and (stored.pending_checkpoint, stored.pending_checkpoint_state) == (pending, state)

    committed = expect_applied(store.checkpoint(KEY, OWNER, Checkpoint.at("15")))
    assert (committed.checkpoint, committed.pending_checkpoint, committed.pending_checkpoint_state) == (
        Checkpoint.at("15"), None, None)
    assert store.get_lease(KEY) == committed


# ------------------------------------------------------------------------------------------------ randomized
_keys = itertools.count()
_sequence_numbers = st.one_of(
    st.integers(min_value=0, max_value=10**129 - 1),
    st.integers(min_value=10**127, max_value=10**127 + 40),  # long numbers that differ in the last digits
)
_checkpoints = st.one_of(
    st.builds(Checkpoint.at, _sequence_numbers.map(str), st.integers(min_value=0, max_value=3)),
    st.sampled_from([TRIM_HORIZON, LATEST, SHARD_END]),
)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(attempts=st.lists(_checkpoints, min_size=1, max_size=8))
def test_stored_checkpoint_is_always_the_running_maximum(store: LeaseStore, attempts: list[Checkpoint]) -> None:
    key = f"shardId-{next(_keys):012d}"
    Leases(store).owned(OWNER, key)
    running = TRIM_HORIZON
    for attempt in attempts:
        outcome = store.checkpoint(key, OWNER, attempt)
        regresses = attempt < running  # SHARD_END is the largest value, so nothing but itself follows it
        assert outcome.applied is not regresses, (running, attempt, outcome)
        if regresses:
            assert outcome.conflict is Conflict.STALE_CHECKPOINT
        else:
            running = attempt
        stored = store.get_lease(key)
        assert stored is not None
        assert stored.checkpoint == running


def test_a_checkpoint_from_the_row_the_owner_saw_is_right_whether_that_row_is_current_or_stale(
        store: LeaseStore, leases: Leases) -> None:
    seen = leases.owned(OWNER)
    first = expect_applied(store.checkpoint(KEY, OWNER, Checkpoint.at("10"), expected=seen))
    assert first.checkpoint == Checkpoint.at("10") and store.get_lease(KEY) == first
    stale = store.checkpoint(KEY, OWNER, Checkpoint.at("20"), expected=seen)  # the row has moved on since
    assert stale.applied and stale.lease is not None and stale.lease.checkpoint == Checkpoint.at("20")
    assert stale.lease.lease_counter == first.lease_counter + 1
    behind = store.checkpoint(KEY, OWNER, Checkpoint.at("15"), expected=first)  # stale row, regressing checkpoint
    assert (behind.applied, behind.conflict) == (False, Conflict.STALE_CHECKPOINT)
    expect_applied(store.start_handoff(KEY, "worker-x", OWNER))
    during = expect_applied(store.checkpoint(KEY, OWNER, Checkpoint.at("30"), expected=stale.lease))
    assert (during.checkpoint, during.checkpoint_owner) == (Checkpoint.at("30"), OWNER)
    expect_applied(store.complete_handoff(KEY, OWNER))
    lost = store.checkpoint(KEY, OWNER, Checkpoint.at("40"), expected=during)  # no longer ours
    assert (lost.applied, lost.conflict) == (False, Conflict.OWNERSHIP)
    assert store.get_lease(KEY).checkpoint == Checkpoint.at("30")  # type: ignore[union-attr]
