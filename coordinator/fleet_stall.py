"""Does the fleet stall at once? The leader's verdict that turns a shared Kinesis outage from churn into a wait.

An agent alone cannot tell a shared outage (Kinesis unreachable or overloaded for everyone) from its own fault: both
look like reads that make no progress. Each agent reports its stalled leases in its worker row
(`LeaseProgress.stalled`, agent/stall_watch.py); the leader, which sees every row, judges (decision 0039).

Invariants:
1. Only live workers holding at least one unfinished lease count (a worker that holds nothing cannot stall).
2. The fleet stalls when at least MIN_HOLDERS such workers hold leases and more than half of them report a stalled
   lease. A single worker, or a minority, stalling is a local fault: its leases are given back as before.
3. The verdict is for agents to keep their stalled leases instead of giving them back (their readers keep retrying);
   it never moves a lease, and an agent heeds it only while fresh (agent/stall_watch.FleetVerdict).
4. Pure: the leader loop passes its live workers and its lease view; the feed carries the verdict to the agents.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shardherd.shared.lease import Lease
from shardherd.shared.worker import WorkerRecord

MIN_HOLDERS = 2  # one worker alone cannot tell a shared outage from its own (and handing round needs two)


@dataclass(frozen=True, slots=True)
class FleetStall:
    """How many live workers hold leases, and how many of them report a stalled one."""

    holders: int
    stalling: int

    @property
    def stalls(self) -> bool:
        """Invariant 2: at least MIN_HOLDERS holders, and a strict majority of them stalling."""
        return self.holders >= MIN_HOLDERS and 2 * self.stalling > self.holders


def judge(live: Iterable[WorkerRecord], leases: Iterable[Lease]) -> FleetStall:
    """The fleet's stall figures from the live workers' rows and the lease view (invariant 1)."""
    owners = {lease.actual_owner for lease in leases if not lease.is_finished}
    holders = [worker for worker in live if worker.worker_id in owners]
    stalling = sum(1 for worker in holders if any(entry.stalled for entry in worker.lease_progress.values()))
    return FleetStall(len(holders), stalling)
