"""Balancing leaves a shard-stalled lease with its owner (decision 0043): a move would only start the stall again
at another worker. The leader filters the decider's balancing moves against its last verdict, as for paused leases;
placing, failing over and draining still move such a lease. A dropped move is not replaced by another in the same
run (as for paused leases): the fleet may stay a lease short of even while the verdict lasts."""

from __future__ import annotations

from shardherd.coordinator.moves import UnplacedReason
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.store import TableNames
from shardherd.shared.worker import LeaseProgress
from tests.services.harness import Replica


def test_a_joining_worker_gets_no_shard_stalled_lease_but_the_others_still_balance() -> None:
    replica = Replica(MemoryLeaseStore(TableNames.for_application("api-test")), shards=6)
    replica.join("w1")
    replica.join("w2")
    replica.step(3)
    owners = replica.owners()
    assert sorted(str(owner) for owner in owners.values()) == ["w1"] * 3 + ["w2"] * 3
    stalled = sorted(key for key, owner in owners.items() if owner == "w1")[:2]
    # the reads of two of w1's leases stalled at w1 and at w2 (w2 held them before): the shard's fault
    replica.lease_progress = {worker: {key: LeaseProgress(stalled=True) for key in stalled} for worker in ("w1", "w2")}
    replica.step(2)
    assert replica.loop.feed.shard_stalls == frozenset(stalled)
    replica.join("w3")  # its share comes from w1 and w2 by balancing
    plans = [summary.plan for summary in replica.step(6) if summary is not None and summary.plan is not None]
    held = [entry for plan in plans for entry in plan.held if entry.reason is UnplacedReason.SHARD_STALLED]
    after = replica.owners()
    assert [after[key] for key in stalled] == ["w1", "w1"]
    assert "w3" in after.values() and held  # balanced with the other leases; the moves it dropped are listed
