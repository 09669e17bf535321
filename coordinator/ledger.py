"""The mutable per-run bookkeeping both strategies share: current owners, per-worker leases and throughput, moves."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shardherd.coordinator.moves import Move, MoveReason, Unplaced, UnplacedReason, WorkerSummary
from shardherd.coordinator.snapshot import LeaseView, Snapshot
from shardherd.shared.worker_metrics import WorkerStatus

MIN_TOTAL_KBPS = 1e-6


class Ledger:
    """Who holds what during one decider pass; every change goes through `move`, so no lease moves twice.

    Lease weights are throughput in KiB/s; a lease without a figure gets the mean of those that have one (as KCL
    does). If the total is 0 (idle stream, new application) every lease weighs 1, so throughput-based logic turns into
    lease counting instead of dividing by zero (where KCL 3.x's decider gets NaN rooms).
    """

    def __init__(self, snapshot: Snapshot) -> None:
        leases = snapshot.leases
        self.leases: dict[str, LeaseView] = {lease.key: lease for lease in leases}
        known = [tp for lease in leases if (tp := lease.throughput_kbps) is not None]
        mean = sum(known) / len(known) if known else 0.0
        weights = {lease.key: mean if (tp := lease.throughput_kbps) is None else tp for lease in leases}
        # Stored figures have 6 decimals, so a total below a millionth of a KiB/s is no throughput at all (and
        # dividing by such a total would overflow).
        self.unit_weights = sum(weights.values()) < MIN_TOTAL_KBPS
        self.weight: dict[str, float] = dict.fromkeys(weights, 1.0) if self.unit_weights else weights
        self.mean_weight = 1.0 if self.unit_weights else mean
        self.owner: dict[str, str | None] = {}
        self.held_by: dict[str, dict[str, None]] = {w.worker_id: {} for w in snapshot.workers}
        self.throughput: dict[str, float] = dict.fromkeys(self.held_by, 0.0)
        self._expired_on: dict[str, int] = {}
        self._guessed: dict[str, float] = {}  # per worker: the weight of its leases that have no reported figure
        self.needy: list[LeaseView] = []  # unassigned or expired
        self._hold(leases)
        self.moves: dict[str, Move] = {}
        self.spillover: list[Unplaced] = []
        self.held: list[Unplaced] = []
        self._count_before = {w: len(keys) for w, keys in self.held_by.items()}
        self._throughput_before = dict(self.throughput)

    def _hold(self, leases: Iterable[LeaseView]) -> None:
        """Each lease's owner at the start of the run, what each owner holds and carries, who needs an owner."""
        held_by, throughput, owners, weight, needy = self.held_by, self.throughput, self.owner, self.weight, self.needy
        for lease in leases:
            # A lease whose handoff is under way already counts where it is going: its load is about to move there.
            # Without a checkpoint owner both are the lease owner (most leases: no property calls).
            key, owner, incoming = lease.key, lease.lease_owner, lease.checkpoint_owner
            if incoming is not None and not lease.pinned:
                owner = incoming  # (the actual owner)
            owners[key] = owner
            if lease.expired or (owner is None and incoming is None):  # (needs_owner, without the property calls)
                needy.append(lease)
            if owner is None:
                continue
            held = held_by.get(owner)
            if held is None:
                held = held_by[owner] = {}
                throughput[owner] = 0.0
            held[key] = None
            throughput[owner] += weight[key]
            if lease.throughput_kbps is None:
                self._guessed[owner] = self._guessed.get(owner, 0.0) + weight[key]
            if lease.expired:
                self._expired_on[owner] = self._expired_on.get(owner, 0) + 1

    def count(self, worker: str) -> int:
        """How many leases the worker holds now (in memory)."""
        return len(self.held_by.get(worker, ()))

    def known_throughput(self, worker: str) -> float:
        """KiB/s the worker holds now counting only reported figures (a lease without one adds nothing)."""
        if self.unit_weights:  # no lease has a figure above 0: every weight is the stand-in 1
            return 0.0
        return self.throughput.get(worker, 0.0) - self._guessed.get(worker, 0.0)

    def live_count(self, worker: str) -> int:
        """Leases the worker holds now, not counting its expired leases that still wait for a new owner."""
        return self.count(worker) - self._expired_on.get(worker, 0)

    def movable(self, worker: str, placed_too: bool = False) -> list[str]:
        """The worker's leases balancing may move: not pinned, not moved in this run or by balancing in the last few.

        With `placed_too`, a lease placed in this run (unassigned, expired, drained) may be moved on: the plan then
        holds one move for it, from its owner before the run to its final worker, with the reason of the last.
        """
        leases, moves = self.leases, self.moves  # (only a lease in a handoff can be pinned: most skip the test)
        return [key for key in self.held_by.get(worker, ())
                if not (lease := leases[key]).recently_moved and not (lease.handoff_blocked and lease.pinned)
                and ((earlier := moves.get(key)) is None or (placed_too and not earlier.reason.is_balancing))]

    def move(self, key: str, to_worker: str, reason: MoveReason, detail: str) -> Move:
        """Record that `key` goes to `to_worker`, updating counts and throughput of both sides.

        A lease moves once per run, except that one placed in this run may be moved on (`movable`).
        """
        earlier = self.moves.get(key)
        if earlier is not None and earlier.reason.is_balancing:
            raise AssertionError(f"lease {key!r} was already moved in this run")
        source, weight, lease = self.owner[key], self.weight[key], self.leases[key]
        guessed = weight if lease.throughput_kbps is None else 0.0
        if source is not None:
            del self.held_by[source][key]
            self.throughput[source] -= weight
            if guessed:
                self._guessed[source] = self._guessed.get(source, 0.0) - guessed
            if not self.held_by[source]:  # exactly 0, not the rounding residue of the subtractions (1e-17 KiB/s)
                self.throughput[source] = self._guessed[source] = 0.0
            if lease.expired and earlier is None:
                self._expired_on[source] -= 1
        self.held_by.setdefault(to_worker, {})[key] = None
        self.throughput[to_worker] = self.throughput.get(to_worker, 0.0) + weight
        if guessed:
            self._guessed[to_worker] = self._guessed.get(to_worker, 0.0) + guessed
        self.owner[key] = to_worker
        first = lease.actual_owner
        if earlier is not None and to_worker == first and not lease.needs_owner:  # no move after all
            del self.moves[key]
            return earlier
        move = Move(key, first, to_worker, reason, detail)
        self.moves[key] = move
        return move

    def priority_leases(self) -> list[LeaseView]:
        """Unassigned leases first, then expired ones longest-silent first (KCL's order), ties largest first.

        Placing equal-priority leases largest first (greedy LPT) spreads a cold start evenly in one run.
        """
        wanted = list(self.needy)
        wanted.sort(key=lambda lease: (lease.actual_owner is not None, -lease.silent_ms, -self.weight[lease.key],
                                       lease.key))
        return wanted

    def drain_leases(self, draining: Iterable[str]) -> list[str]:
        """Live leases on draining workers (as actual or incoming owner), largest first; pinned ones go to `held`."""
        gone = set(draining)
        keys: list[str] = []
        if not gone:
            return keys
        # The actual owner is the checkpoint owner or the lease owner: a cheap filter before the exact test.
        near = [lease for lease in self.leases.values() if lease.lease_owner in gone or lease.checkpoint_owner in gone]
        for lease in near:
            if lease.needs_owner or lease.key in self.moves:
                continue
            if lease.actual_owner not in gone and lease.lease_owner not in gone:
                continue
            if lease.pinned:
                self.held.append(
                    Unplaced(lease.key, lease.actual_owner, UnplacedReason.HANDOFF_PENDING, "draining; handoff pending")
                )
            else:
                keys.append(lease.key)
        keys.sort(key=lambda key: (-self.weight[key], key))
        return keys

    def spill(self, lease: LeaseView, reason: UnplacedReason, detail: str) -> None:
        """Report a priority lease that found no worker."""
        self.spillover.append(Unplaced(lease.key, lease.actual_owner, reason, detail))

    def summary(
        self,
        worker: str,
        status: WorkerStatus,
        before: Mapping[str, float],
        after: Mapping[str, float],
        note: str = "",
    ) -> WorkerSummary:
        """The per-worker line of the plan, with counts and throughput before and after."""
        return WorkerSummary(
            worker_id=worker,
            status=status,
            leases_before=self._count_before.get(worker, 0),
            leases_after=self.count(worker),
            throughput_before=round(self._throughput_before.get(worker, 0.0), 6),
            throughput_after=round(self.throughput.get(worker, 0.0), 6),
            metrics_before=before,
            metrics_after=after,
            note=note,
        )


def priority_reason(lease: LeaseView) -> MoveReason:
    """UNASSIGNED for a lease without owner, EXPIRED for one whose owner stopped renewing."""
    return MoveReason.UNASSIGNED if lease.actual_owner is None else MoveReason.EXPIRED
