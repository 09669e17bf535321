"""Liveness judged on the leader's own clock: counters and heartbeats watched for change, never clocks compared."""

from __future__ import annotations

from shardherd.coordinator.liveness import LivenessTracker, WorkerGrace
from shardherd.shared.lease import Lease
from shardherd.shared.worker import WorkerRecord

FAILOVER = 10.0


def _tracker(mode: str) -> LivenessTracker:
    return LivenessTracker(mode=mode, failover_seconds=FAILOVER, grace=WorkerGrace.uniform(FAILOVER))


def _worker(worker_id: str, heartbeat: int, lut: int) -> WorkerRecord:
    return WorkerRecord(worker_id=worker_id, last_update=lut, heartbeat=heartbeat)


def test_worker_mode_expires_leases_of_a_silent_worker_only() -> None:
    tracker = _tracker("worker")
    leases = [Lease("s-0", lease_owner="a"), Lease("s-1", lease_owner="b")]
    now = 100.0
    for beat in range(12):  # a heartbeats every 1 s; b stops after the first observation
        tracker.observe(leases, [_worker("a", beat, 1000 + beat), _worker("b", 0, 1000)], now)
        now += 1.0
    assert tracker.lease(leases[0], now).expired is False
    verdict = tracker.lease(leases[1], now)
    assert verdict.expired is True and verdict.silent_seconds == now - 100.0
    assert tracker.worker_alive("a", now) and not tracker.worker_alive("b", now)


def test_a_row_first_seen_after_the_terms_first_scan_is_alive_at_once_and_still_expires() -> None:
    """A row the first scan found may be a dead worker's last: alive only once it changes. A row that appears at a
    later scan was written since, so it is alive (and a receiver) at once; unchanged, it expires one failover later."""
    tracker = _tracker("worker")
    tracker.observe([], [_worker("old", 3, 1000)], 100.0)
    tracker.observe([], [_worker("old", 3, 1000), _worker("new", 1, 1001)], 101.0)
    assert not tracker.worker_alive("old", 101.0)
    assert tracker.worker_alive("new", 101.0) and tracker.worker_receives("new", 101.0)
    tracker.observe([], [_worker("old", 3, 1000), _worker("new", 1, 1001)], 101.0 + FAILOVER + 1)
    assert not tracker.worker_alive("new", 101.0 + FAILOVER + 1)


def test_skewed_wall_clock_of_a_worker_does_not_matter() -> None:
    tracker = _tracker("worker")
    lease = Lease("s-0", lease_owner="skewed")
    # The worker's own `lut` is an hour behind and even goes backwards; only the heartbeat counter changing counts.
    for step in range(30):
        tracker.observe([lease], [_worker("skewed", step, 1_000 - 3_600 - step)], 100.0 + step)
    assert tracker.lease(lease, 130.0).expired is False


def test_new_leader_gives_every_owned_lease_a_full_failover_period() -> None:
    tracker = _tracker("lease")
    lease = Lease("s-0", lease_owner="a", lease_counter=7)
    tracker.observe([lease], [], 50.0)  # first sighting: assumed freshly renewed
    assert tracker.lease(lease, 50.0 + FAILOVER).expired is False
    tracker.observe([lease], [], 50.0 + FAILOVER + 0.5)
    assert tracker.lease(lease, 50.0 + FAILOVER + 0.5).expired is True


def test_lease_mode_watches_counters() -> None:
    tracker = _tracker("lease")
    now = 0.0
    for counter in range(20):
        renewed = Lease("s-0", lease_owner="a", lease_counter=counter)
        tracker.observe([renewed, Lease("s-1", lease_owner="b", lease_counter=3)], [], now)
        now += 1.0
    assert tracker.lease(Lease("s-0", lease_owner="a", lease_counter=19), now).expired is False
    assert tracker.lease(Lease("s-1", lease_owner="b", lease_counter=3), now).expired is True


def test_unowned_is_expired_and_owner_without_record_expires_after_failover() -> None:
    tracker = _tracker("worker")
    assert tracker.lease(Lease("s-0"), 0.0).expired is True
    ghost = Lease("s-1", lease_owner="ghost")
    tracker.observe([ghost], [], 0.0)
    assert tracker.lease(ghost, FAILOVER).expired is False
    tracker.observe([ghost], [], FAILOVER + 1)
    assert tracker.lease(ghost, FAILOVER + 1).expired is True


def test_leader_assignment_restarts_the_clock_in_lease_mode() -> None:
    tracker = _tracker("lease")
    lease = Lease("s-0", lease_owner="a", lease_counter=1)
    tracker.observe([lease], [], 0.0)
    tracker.assigned("s-0", 2, "b", 15.0)
    moved = Lease("s-0", lease_owner="b", lease_counter=2)
    tracker.observe([moved], [], 20.0)
    assert tracker.lease(moved, 24.0).expired is False
    assert tracker.lease(moved, 25.5).expired is True


def test_a_worker_is_alive_only_once_its_heartbeat_was_seen_changing() -> None:
    # A dead worker's last record looks like a live one to a new leader; it must not receive leases on sight.
    tracker = _tracker("worker")
    tracker.observe([], [_worker("dead", 41, 1000), _worker("live", 7, 1000)], 0.0)
    assert not tracker.worker_alive("dead", 0.0) and not tracker.worker_alive("live", 0.0)
    tracker.observe([], [_worker("dead", 41, 1000), _worker("live", 8, 1003)], 3.0)
    assert tracker.worker_alive("live", 3.0)
    assert not tracker.worker_alive("dead", 3.0)
    # Its leases are still given the benefit of the doubt for a failover period (no clocks compared).
    lease = Lease("s-0", lease_owner="dead")
    assert tracker.lease(lease, 3.0).expired is False
    assert tracker.lease(lease, FAILOVER + 0.5).expired is True


def test_the_next_verdict_is_when_a_quiet_live_worker_would_count_as_gone() -> None:
    # The leader runs then, so a crashed worker's leases move one failover after its last heartbeat was seen, not
    # up to an assignment interval later.
    tracker = _tracker("worker")
    leases = [Lease("s-0", lease_owner="a"), Lease("s-1", lease_owner="b")]
    for step in range(3):  # both beat every second; b's last heartbeat is seen at 102
        tracker.observe(leases, [_worker("a", step, 1000 + step), _worker("b", step, 1000 + step)], 100.0 + step)
    assert tracker.next_verdict(102.5, quiet=1.2) is None  # both wrote within a heartbeat period
    tracker.observe(leases, [_worker("a", 3, 1003), _worker("b", 2, 1002)], 103.0)
    tracker.observe(leases, [_worker("a", 4, 1004), _worker("b", 2, 1002)], 104.0)
    assert tracker.next_verdict(104.0, quiet=1.2) == 102.0 + FAILOVER  # b went quiet: its failover ends then
    assert tracker.next_verdict(104.0, quiet=5.0) is None
    assert tracker.next_verdict(102.0 + FAILOVER + 0.1, quiet=9.0) is None  # b is gone, a not quiet that long


def test_a_new_leaders_verdict_on_a_row_it_never_saw_change_is_scheduled_too() -> None:
    # After a takeover the dead worker's row is one the new leader has not seen change: its verdict must still get
    # a run of its own (one failover after the row was first seen), not wait for the next interval's run.
    tracker = _tracker("worker")
    tracker.observe([Lease("s-0", lease_owner="dead")], [_worker("dead", 41, 1000)], 100.0)
    assert not tracker.worker_alive("dead", 103.0)
    assert tracker.next_verdict(103.0, quiet=1.2) == 100.0 + FAILOVER
    assert tracker.next_verdict(100.0 + FAILOVER + 0.1, quiet=1.2) is None  # gone: nothing left to schedule


def test_rows_seen_changing_while_contending_are_alive_at_once_for_the_new_leader() -> None:
    # The receivers of a dead worker's leases: the replica saw them beat while it contended for the lock, on its own
    # clock, so as leader it need not wait for their next heartbeat before handing them leases.
    contending = _tracker("worker")
    contending.observe((), [_worker("live", 7, 1000), _worker("dead", 41, 1000)], 10.0)
    contending.observe((), [_worker("live", 8, 1004), _worker("dead", 41, 1000)], 14.0)
    leader = _tracker("worker")
    leader.start_from(contending.row_sightings(), contending.confirmed_workers())
    leader.observe([Lease("s-0", lease_owner="dead")], [_worker("live", 8, 1004), _worker("dead", 41, 1000)], 16.0)
    assert leader.worker_alive("live", 16.0) and not leader.worker_alive("dead", 16.0)
    assert leader.lease(Lease("s-0", lease_owner="dead"), 10.0 + FAILOVER + 0.1).expired  # silent since 10.0
    stale = _tracker("worker")  # a row that changed since it was sighted is judged afresh, confirmed or not
    stale.start_from(contending.row_sightings(), contending.confirmed_workers())
    stale.observe((), [_worker("live", 9, 1008)], 18.0)
    assert not stale.worker_alive("live", 18.0)
