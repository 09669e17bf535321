"""The leader's fleet-stall verdict (coordinator/fleet_stall.py, decision 0039): most lease-holding live workers
reporting a stalled lease, at least two of them, is a fleet-wide stall; one worker or a minority is a local fault."""

from __future__ import annotations

from shardherd.coordinator.assignment_feed import AssignmentFeed
from shardherd.coordinator.fleet_stall import MIN_HOLDERS, FleetStall, judge
from shardherd.shared.checkpoint import SHARD_END
from shardherd.shared.lease import Lease
from shardherd.shared.worker import LeaseProgress, WorkerRecord

STALLED = LeaseProgress(stalled=True)


def worker(name: str, *stalled: str, throttled: str | None = None) -> WorkerRecord:
    progress = {key: STALLED for key in stalled}
    if throttled is not None:
        progress[throttled] = LeaseProgress(throttled=3)  # in trouble, but reading: not a stall
    return WorkerRecord(name, 1, lease_progress=progress)


def fleet(size: int) -> list[Lease]:
    """One lease per worker w0..w(size-1)."""
    return [Lease(f"s{index}", lease_owner=f"w{index}") for index in range(size)]


def test_the_rule_needs_two_holders_and_a_strict_majority() -> None:
    assert MIN_HOLDERS == 2
    assert not FleetStall(1, 1).stalls  # a worker alone cannot tell a shared outage from its own
    assert FleetStall(2, 2).stalls and not FleetStall(2, 1).stalls
    assert FleetStall(3, 2).stalls and not FleetStall(4, 2).stalls
    assert FleetStall(32, 17).stalls and not FleetStall(32, 16).stalls
    assert not FleetStall(0, 0).stalls


def test_most_holders_stalling_is_a_fleet_stall_and_one_is_a_local_fault() -> None:
    leases = fleet(3)
    everyone = [worker("w0", "s0"), worker("w1", "s1"), worker("w2", "s2")]
    assert judge(everyone, leases) == FleetStall(3, 3)
    assert judge([*everyone[:2], worker("w2")], leases).stalls  # 2 of 3
    one = [worker("w0", "s0"), worker("w1"), worker("w2", throttled="s2")]
    assert judge(one, leases) == FleetStall(3, 1) and not judge(one, leases).stalls


def test_only_live_workers_that_hold_unfinished_leases_count() -> None:
    leases = [*fleet(2), Lease("done", lease_owner="w2", checkpoint=SHARD_END),
              Lease("moving", lease_owner="w4", checkpoint_owner="w3")]
    rows = [worker("w0", "s0"), worker("w1", "s1"),
            worker("w2"),  # holds only a finished lease
            worker("w3"),  # hands a lease off: it still reads it, so it holds
            worker("w5", "gone")]  # holds nothing (a row left over): not counted, stalled or not
    assert judge(rows, leases) == FleetStall(3, 2)
    assert judge(rows[:1], leases) == FleetStall(1, 1) and not judge(rows[:1], leases).stalls  # the rest not live


def test_the_feed_carries_the_latest_verdict_in_every_position_until_it_stands_down() -> None:
    feed = AssignmentFeed()
    leases = fleet(2)
    feed.observe(1, leases)
    quiet = feed.position("w0")
    assert not quiet.fleet_stalls
    feed.observe(1, leases, fleet_stalls=True)
    stalling = feed.position("w0")
    assert stalling.fleet_stalls and feed.position("w9").fleet_stalls  # every worker hears it
    assert stalling.version == quiet.version  # no lease changed: nobody is woken for it
    feed.stand_down()
    assert not feed.fleet_stalls
    feed.observe(2, leases)
    assert not feed.position("w0").fleet_stalls
