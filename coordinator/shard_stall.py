"""Does one shard stall at every owner? The leader's per-lease verdict that stops handing such a lease round.

The per-shard analogue of the fleet verdict (coordinator/fleet_stall.py, decision 0039). A hot shard whose reads time
out at every owner (an overloaded Kinesis, a shard past its limits) is given back by each owner's stall watch at its
bound for failing reads, and the leader hands it to the next worker, which does the same: each move re-reads from the
checkpoint, pays a GetShardIterator (limited per shard) and delivers records again, and none of it helps. The leader
sees every worker row: the stalled leases each agent reports (`LeaseProgress.stalled`) and those it gave back
(`refused`). When a lease's reads stalled at two workers within a window, the fault is the shard's or the
service's, not a worker's: the owner keeps it (decision 0043).

Invariants:
1. Evidence is per (lease, worker) with the leader's monotonic time it was last seen: a live worker's row reporting
   the lease stalled creates or refreshes it; the same row reporting the lease refused (given back) refreshes an
   existing one only, so a lease given back for another reason (a processor that fails to start, decision 0022)
   never counts.
2. A lease is *shard-stalled* while it is unfinished and evidence of at least MIN_WORKERS distinct workers is known.
3. Evidence is forgotten `window` seconds after it was last seen (2 give-up spans of a slow reader: the first owner's
   evidence outlives the second owner's whole give-up span). While the lease is shard-stalled and its current owner
   still reports it stalled, all its evidence counts as seen now: a shard that keeps failing keeps its verdict,
   however long it lasts. Once the owner reads again the verdict ends `window` later (a shard that stalls again
   meanwhile is kept at once); a finished lease has none.
4. The verdict never moves a lease: the feed tells each owner which of its leases are shard-stalled
   (`FeedPosition.shard_stalls`), and its stall watch keeps them while the word is fresh (agent/stall_watch.py,
   invariant 4). A reader that is not running is still given back at once. Nor does balancing move one: the leader
   drops the decider's balancing moves of the leases under its last verdict (`Plan.hold_balancing`, as for paused
   leases); placing, failing over and draining still move them.
5. Pure bookkeeping on the leader's clock; memory of one leader term. A new leader starts without evidence: the
   owner's stall report counts at once, an earlier owner's refusal only after a stall of it was seen (invariant 1),
   so a lease kept across a leader change may move once more (its owner gives it back a give-up span after the old
   leader's last word) before the verdict holds again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from shardherd.shared.config import Settings
from shardherd.shared.lease import Lease
from shardherd.shared.stall_bounds import StallBounds
from shardherd.shared.worker import WorkerRecord

MIN_WORKERS = 2  # a lease whose reads stalled at two workers is the shard's fault (or the service's), not a worker's
WINDOW_GIVE_UPS = 2  # evidence is kept for this many give-up spans of a slow reader (invariant 3)


def window_for(settings: Settings) -> float:
    """Seconds evidence is kept after it was last seen (invariant 3): 83.9 s at the defaults."""
    return WINDOW_GIVE_UPS * StallBounds.from_settings(settings).give_up_after


@dataclass
class ShardStalls:
    """Per lease, the workers at which its reads stalled and when each was last seen (invariants 1-3)."""

    window: float
    seen: dict[str, dict[str, float]] = field(default_factory=dict)  # lease -> worker -> monotonic time last seen
    verdict: frozenset[str] = frozenset()  # the shard-stalled leases of the last `judge`

    def judge(self, live: Iterable[WorkerRecord], leases: Iterable[Lease], now: float) -> frozenset[str]:
        """The shard-stalled leases after this run's rows (invariant 2); remembered as `verdict`."""
        owners = {lease.lease_key: lease.actual_owner for lease in leases if not lease.is_finished}
        still = self._note(live, owners, now)
        kept: dict[str, dict[str, float]] = {}
        for key, workers in self.seen.items():
            if key not in owners:
                continue
            if key in self.verdict and key in still:
                workers = dict.fromkeys(workers, now)  # a verdict its owner still stalls under: all seen now
            else:
                workers = {worker: at for worker, at in workers.items() if now - at <= self.window}
            if workers:
                kept[key] = workers
        self.seen = kept
        self.verdict = frozenset(key for key, workers in kept.items() if len(workers) >= MIN_WORKERS)
        return self.verdict

    def _note(self, live: Iterable[WorkerRecord], owners: dict[str, str | None], now: float) -> set[str]:
        """Record the rows' evidence (invariant 1); the leases whose current owner reports them stalled now."""
        still = set()
        for worker in live:
            for key, entry in worker.lease_progress.items():
                if key not in owners:
                    continue
                if entry.stalled:
                    self.seen.setdefault(key, {})[worker.worker_id] = now
                    if owners[key] == worker.worker_id:
                        still.add(key)
                elif entry.refused and worker.worker_id in self.seen.get(key, {}):
                    self.seen[key][worker.worker_id] = now
        return still

    def workers(self, lease_key: str) -> list[str]:
        """The workers whose reads of the lease stalled, as remembered (for the log and the operator API)."""
        return sorted(self.seen.get(lease_key, {}))
