"""Strategy `lease-count`: every worker holds floor(n/w) or floor(n/w)+1 leases (KCL's LEASE_COUNT_BASED).

Chosen by `lease_assignment_strategy = lease-count`.

Quotas use the Event Hubs processor's expected/max arithmetic: with n leases and w non-draining workers, every worker
is expected to hold `base = n // w` and exactly `n % w` of them may hold `base + 1`. Which workers get the `+1`
decides between "fewest moves" and "fair": workers already at `base + 1` keep it (no move); the remaining extra slots
are spread over over-full and under-full workers in proportion to their numbers. So when 100 workers with 5 leases
each are joined by 100 empty ones (500 leases), the result is 250/250 between the two groups, not KCL 2.x's stable
300/200 in which every old worker carries 50 % more than every new one; and a fleet that is already within one lease
of even gets no move at all. Metrics are ignored. Expired leases do not count for their owner.
"""

from __future__ import annotations

import heapq

from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.ledger import Ledger, priority_reason
from shardherd.coordinator.moves import MoveReason, Plan, Unplaced, UnplacedReason
from shardherd.coordinator.snapshot import Snapshot
from shardherd.shared.worker_metrics import WorkerStatus

Slot = tuple[bool, int, str]
NAME = "lease-count"


def quotas(loads: dict[str, int], n_leases: int, cap: int) -> dict[str, int]:
    """Each worker's lease quota (see the module docstring); `loads` holds the live lease count of every worker."""
    if not loads:
        return {}
    base, extra = divmod(n_leases, len(loads))
    at_max = sorted(w for w, load in loads.items() if load == base + 1)
    lucky = set(at_max[:extra])
    spare = extra - len(lucky)
    if spare > 0:
        over = sorted((w for w, load in loads.items() if load > base + 1), key=lambda w: (-loads[w], w))
        under = sorted((w for w, load in loads.items() if load <= base), key=lambda w: (-loads[w], w))
        total = len(over) + len(under)
        to_over = min(len(over), (spare * len(over) + total // 2) // total)
        to_under = min(len(under), spare - to_over)
        to_over = min(len(over), spare - to_under)
        lucky.update(over[:to_over])
        lucky.update(under[:to_under])
    return {w: min(cap, base + (w in lucky)) for w in loads}


class LeaseCountPass:
    """One pass of the lease-count strategy over a snapshot; call `plan(balance)` once."""

    def __init__(self, snapshot: Snapshot, config: DeciderConfig) -> None:
        self.config = config
        self.ledger = ledger = Ledger(snapshot)
        self.draining = [w.worker_id for w in snapshot.workers if w.draining]
        self.active = [w.worker_id for w in snapshot.workers if not w.draining]
        loads = {wid: ledger.live_count(wid) for wid in self.active}
        self.quota = quotas(loads, len(snapshot.leases), config.max_leases_for_worker)
        self.heap: list[Slot] = [self._slot(w) for w in self.active if loads[w] < config.max_leases_for_worker]
        heapq.heapify(self.heap)

    def _slot(self, wid: str) -> Slot:
        load = self.ledger.live_count(wid)
        return (load >= self.quota[wid], load, wid)

    def _give(self, key: str, wid: str, reason: MoveReason, detail: str) -> None:
        self.ledger.move(key, wid, reason, detail)
        if self.ledger.live_count(wid) < self.config.max_leases_for_worker:
            heapq.heappush(self.heap, self._slot(wid))

    def _place(self, key: str, reason: MoveReason) -> bool:
        """Give a lease that must move to the least-loaded worker below its quota (else below max); False if none."""
        if not self.heap:
            return False
        chosen = heapq.heappop(self.heap)
        lease = self.ledger.leases[key]
        if lease.avoids(chosen[2]) and self.heap:
            chosen = heapq.heapreplace(self.heap, chosen)  # not to an owner it expired under or a refuser
        _, load, wid = chosen
        self._give(key, wid, reason, f"least loaded: {load} leases, quota {self.quota[wid]}")
        return True

    def _unplaced_reason(self) -> UnplacedReason:
        return UnplacedReason.NO_CAPACITY if self.active else UnplacedReason.NO_ACTIVE_WORKER

    def _shed(self) -> None:
        """Move leases from workers over quota to workers under quota, fullest donors first."""
        load = self.ledger.live_count
        over = sorted((w for w in self.active if load(w) > self.quota[w]), key=lambda w: (-load(w), w))
        for donor in over:
            keys = sorted(self.ledger.movable(donor))
            for key in keys[: load(donor) - self.quota[donor]]:
                if not self.heap or self.heap[0][0]:
                    return
                _, receiver_load, wid = heapq.heappop(self.heap)
                detail = f"{donor} {load(donor)} > quota {self.quota[donor]}; {wid} {receiver_load} < {self.quota[wid]}"
                self._give(key, wid, MoveReason.LEASE_COUNT, detail)

    def plan(self, balance: bool) -> Plan:
        """Priority assignment, then drain, then (on balancing runs) lease-count balancing."""
        ledger = self.ledger
        for lease in ledger.priority_leases():
            if not self._place(lease.key, priority_reason(lease)):
                ledger.spill(lease, self._unplaced_reason(), "no non-draining worker below max leases")
        for key in ledger.drain_leases(self.draining):
            if not self._place(key, MoveReason.DRAIN):
                ledger.held.append(Unplaced(key, ledger.owner[key], self._unplaced_reason(), "draining; no receiver"))
        if balance:
            self._shed()
        n, w = len(ledger.leases), len(self.active)
        note = f"{n} leases on {w} workers: {n // w} each, {n % w} may hold one more" if w else "no active worker"
        summaries = [
            ledger.summary(wid, WorkerStatus.DRAINING, {}, {}, "draining")
            if wid in self.draining
            else ledger.summary(wid, WorkerStatus.ACTIVE, {}, {}, f"quota {self.quota[wid]}")
            for wid in ledger.held_by
            if wid in self.quota or wid in self.draining
        ]
        return Plan(
            strategy=NAME,
            balanced=balance,
            moves=tuple(ledger.moves.values()),
            spillover=tuple(ledger.spillover),
            held=tuple(ledger.held),
            workers=tuple(summaries),
            notes=(note,),
        )


class LeaseCountDecider:
    """The `lease-count` strategy behind the `Decider` protocol."""

    name = NAME

    def plan(self, snapshot: Snapshot, config: DeciderConfig, balance: bool) -> Plan:
        """Priority assignment, drain, and (if `balance`) moves from workers over quota to workers under it."""
        return LeaseCountPass(snapshot, config).plan(balance)
