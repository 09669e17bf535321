"""A model of KCL 2.x's lease taker (`DynamoDBLeaseTaker`), for comparison with the leader-based assignment.

Every worker runs `take_leases()` on its own schedule (`(failover + epsilon) x 2`, fixed delay): a full scan, expiry
judged from counters it watched change on its own clock, a lease-count target of `ceil(leases / visible workers)`,
very old leases (unowned, or silent for 3 x failover) taken all at once, otherwise expired ones up to the target,
otherwise one steal from the most loaded worker. KCL conditions a take on the counter seen in the scan; the model
writes it as the store's `assign` conditioned on the owner seen in the scan (KCL 2.x has no handoffs, so no checkpoint
owner). The two agree here: the simulator's scan and takes happen at one instant, so no renewal falls between them.

Not modelled: the re-read of steal candidates when a scan took longer than half of `failover / 3` (scans are instant
in the simulator) and the 3 retries on throttling (the in-memory store never throttles).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from shardherd.shared.clock import Clock
from shardherd.shared.lease import Lease
from shardherd.shared.store import LeaseStore


@dataclass(slots=True)
class _Seen:
    counter: int
    last_increment: float | None  # None: never seen renewed (KCL's 0 nanos)


def taker_interval_seconds(failover_seconds: float, epsilon_seconds: float) -> float:
    """How often a KCL 2.x worker runs its taker: `(failover + epsilon) x 2`."""
    return (failover_seconds + epsilon_seconds) * 2


class Kcl2Taker:
    """One worker's lease taker; `take_leases()` returns the leases it took in this pass."""

    def __init__(self, worker_id: str, store: LeaseStore, clock: Clock, failover_seconds: float,
                 rng: random.Random, max_leases_for_worker: int = 2**31 - 1, max_leases_to_steal: int = 1,
                 priority_assignment: bool = True) -> None:
        self.worker_id = worker_id
        self._store = store
        self._clock = clock
        self._failover = failover_seconds
        self._rng = rng
        self._max_leases = max_leases_for_worker
        self._max_steal = max_leases_to_steal
        self._priority = priority_assignment
        self._seen: dict[str, _Seen] = {}

    def _observe(self, leases: list[Lease], now: float) -> None:
        seen: dict[str, _Seen] = {}
        for lease in leases:
            previous = self._seen.get(lease.lease_key)
            if previous is None:
                seen[lease.lease_key] = _Seen(lease.lease_counter, None if lease.lease_owner is None else now)
            elif previous.counter != lease.lease_counter:
                seen[lease.lease_key] = _Seen(lease.lease_counter, now)
            else:
                seen[lease.lease_key] = previous
        self._seen = seen

    def _available(self, lease: Lease, now: float) -> bool:
        last = self._seen[lease.lease_key].last_increment
        return lease.lease_owner is None or last is None or now - last > self._failover

    def _very_old(self, lease: Lease, now: float) -> bool:
        last = self._seen[lease.lease_key].last_increment
        return last is None or last < now - 3 * self._failover

    def take_leases(self) -> list[Lease]:
        """One taker pass: scan, judge expiry, pick leases to take or steal, take them conditionally."""
        leases = self._store.scan_leases().leases
        now = self._clock.monotonic()
        self._observe(leases, now)
        available = [lease for lease in leases if self._available(lease, now)]
        counts: dict[str, int] = {}
        for lease in leases:
            if lease.lease_owner is not None and not self._available(lease, now):
                counts[lease.lease_owner] = counts.get(lease.lease_owner, 0) + 1
        counts.setdefault(self.worker_id, 0)
        target = 1 if len(counts) >= len(leases) else math.ceil(len(leases) / len(counts))
        target = min(target, self._max_leases)
        mine = counts[self.worker_id]
        needed = target - mine
        if self._priority:
            very_old = [lease for lease in available if self._very_old(lease, now)]
            if very_old:
                self._rng.shuffle(very_old)
                return self._take(very_old[: max(0, self._max_leases - mine)])
        if needed <= 0:
            return []
        if available:
            self._rng.shuffle(available)
            return self._take(available[:needed])
        return self._take(self._steal(leases, counts, target, needed))

    def _steal(self, leases: list[Lease], counts: dict[str, int], target: int, needed: int) -> list[Lease]:
        """Leases to steal from the most loaded worker (first one met on ties)."""
        victim = max(counts, key=lambda worker: counts[worker])  # max() keeps the first of equal counts
        if victim == self.worker_id or counts[victim] < target:
            return []
        steal = min(needed, counts[victim] - target)
        if steal == 0 and needed > 1:
            steal = 1
        steal = min(steal, self._max_steal)
        if steal <= 0:
            return []
        theirs = [lease for lease in leases if lease.lease_owner == victim]
        return self._rng.sample(theirs, min(steal, len(theirs)))

    def _take(self, chosen: list[Lease]) -> list[Lease]:
        taken = []
        for lease in chosen:
            outcome = self._store.assign(lease.lease_key, self.worker_id, lease.lease_owner, lease.checkpoint_owner)
            if outcome.applied and outcome.lease is not None:
                taken.append(outcome.lease)
                self._seen[lease.lease_key] = _Seen(outcome.lease.lease_counter, self._clock.monotonic())
        return taken
