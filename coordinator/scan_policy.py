"""When the leader scans the store: every assignment interval while anything needs watching, else rarely.

A full run scans the lease table and the worker table; at 1,000 shards that is about 40 read units, so scanning
every 2 s cost more reads than a whole KCL fleet (docs/store-cost.md). Between full runs the leader keeps its view in
memory (its last scans with its own conditional writes applied) and scans again when one of these holds
(docs/decisions/0010-leader-scans.md):

* `lease` liveness mode: expiry is judged from lease counters, which only a scan shows;
* something is pending in the view: leases without a live owner, handoffs in flight, a write that lost its race, a
  worker row whose liveness is not yet decided (a new worker, or one going quiet), a shard sync that changed leases,
  a balancing pass that moved leases (the fleet converges at the interval's pace, as before);
* a worker the last full run counted alive is not on the coordinator channel (Java KCL workers, agents without
  `coordinator_url`, an agent whose connection dropped): only its row shows whether it lives; or it counted none;
* a signal from the channel: a worker joined, a waiting request was dropped, an agent reported news (drain, leases
  given back, a shard's end);
* the full-scan interval (`leader_full_scan_interval_millis`) has passed.

Pure: the loop gathers the inputs and does the I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ViewState:
    """What the last full run left behind: when it scanned, whom it counted alive, and what it still waits for."""

    scanned_at: float
    roster: frozenset[str]  # workers alive at that run: each must stay on the channel for the leader to scan rarely
    pending: str | None  # why the view needs watching every interval (None: nothing)


# Why a run scans (RunSummary.scan_reason), besides what is pending or signalled; None: a tick on the view.
FIRST, LEASE_MODE, CADENCE = "first run of the term", "lease mode", "full-scan interval"
NO_WORKERS = "no live worker yet"  # a worker without coordinator_url would otherwise wait for the full scan


def scan_reason(view: ViewState | None, now: float, full_scan_interval: float, lease_mode: bool,
                on_channel: Callable[[str], bool], signals: Sequence[tuple[str, str]]) -> str | None:
    """Why this tick must scan the store, or None when the leader's view may stand until the next tick."""
    if view is None:
        return FIRST
    if lease_mode:
        return LEASE_MODE
    if view.pending is not None:
        return view.pending
    if signals:
        worker, kind = signals[0]
        return f"{kind}: {worker}"
    if not view.roster:
        return NO_WORKERS
    for worker in sorted(view.roster):
        if not on_channel(worker):
            return f"not on the channel: {worker}"
    if now - view.scanned_at >= full_scan_interval:
        return CADENCE
    return None


def pending_in(unplaced: int, handoffs: int, lost: int, undecided: Collection[str],
               sync_changed: bool, rebalancing: bool) -> str | None:
    """Why a view needs watching every interval after a full run, or None (inputs counted by the loop)."""
    if unplaced:
        return f"{unplaced} leases without a live owner"
    if handoffs:
        return f"{handoffs} handoffs in flight"
    if lost:
        return f"{lost} writes lost their race"
    if undecided:
        return f"liveness not yet decided: {min(undecided)}"
    if sync_changed:
        return "shard sync changed leases"
    if rebalancing:
        return "balancing moved leases in its last pass"
    return None
