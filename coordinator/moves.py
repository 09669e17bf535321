"""The decider's output: moves with machine-readable reasons, leases left unplaced, and a per-worker summary."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from shardherd.coordinator.load_model import Line
from shardherd.shared.worker_metrics import WorkerStatus


class MoveReason(enum.Enum):
    """Why a lease gets a new owner."""

    UNASSIGNED = "UNASSIGNED"
    EXPIRED = "EXPIRED"
    DRAIN = "DRAIN"
    BALANCE_CPU = "BALANCE_CPU"
    BALANCE_MEMORY = "BALANCE_MEMORY"
    BALANCE_NETWORK_IN = "BALANCE_NETWORK_IN"
    BALANCE_NETWORK_OUT = "BALANCE_NETWORK_OUT"
    BALANCE_THROUGHPUT = "BALANCE_THROUGHPUT"
    BALANCE_OTHER = "BALANCE_OTHER"
    LEASE_COUNT = "LEASE_COUNT"

    @property
    def is_balancing(self) -> bool:
        """True for moves made to even out load (not for placing, draining or failing over)."""
        return self not in (MoveReason.UNASSIGNED, MoveReason.EXPIRED, MoveReason.DRAIN)

    @classmethod
    def for_metric(cls, metric: str) -> MoveReason:
        """The balancing reason for a KCL metric short name (C, M, NI, NO, T); unknown names map to BALANCE_OTHER."""
        return _BY_METRIC.get(metric, cls.BALANCE_OTHER)


_BY_METRIC = {
    "C": MoveReason.BALANCE_CPU,
    "M": MoveReason.BALANCE_MEMORY,
    "NI": MoveReason.BALANCE_NETWORK_IN,
    "NO": MoveReason.BALANCE_NETWORK_OUT,
    "T": MoveReason.BALANCE_THROUGHPUT,
}


class UnplacedReason(enum.Enum):
    """Why a lease that should move stays where it is (or without an owner)."""

    NO_ACTIVE_WORKER = "NO_ACTIVE_WORKER"
    NO_CAPACITY = "NO_CAPACITY"
    HANDOFF_PENDING = "HANDOFF_PENDING"
    PAUSED = "PAUSED"  # an operator paused it: balancing leaves it with its owner (coordinator/paused_leases.py)
    SHARD_STALLED = "SHARD_STALLED"  # its reads stalled at two workers or more: balancing leaves it (decision 0043)
    # A new leader's first scan found agent rows it cannot yet call alive or dead: it places nothing unowned and
    # balances nothing until they are decided, at most one heartbeat and one interval into its term (decision 0047).
    ROSTER_PENDING = "ROSTER_PENDING"


@dataclass(frozen=True, slots=True)
class Move:
    """Give `lease_key` to `to_worker`; `from_owner` is the lease's actual owner before the move (None if unowned)."""

    lease_key: str
    from_owner: str | None
    to_worker: str
    reason: MoveReason
    detail: str


@dataclass(frozen=True, slots=True)
class Unplaced:
    """A lease the decider wanted to place but could not, with the owner it keeps (None = stays unowned)."""

    lease_key: str
    owner: str | None
    reason: UnplacedReason
    detail: str


@dataclass(frozen=True, slots=True)
class WorkerSummary:
    """One worker before and after the plan: lease count, throughput and metric values (EMA, projected)."""

    worker_id: str
    status: WorkerStatus
    leases_before: int
    leases_after: int
    throughput_before: float
    throughput_after: float
    metrics_before: Mapping[str, float] = field(default_factory=dict)
    metrics_after: Mapping[str, float] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything one decider pass decided, in the order the moves were chosen."""

    strategy: str
    balanced: bool
    moves: tuple[Move, ...]
    spillover: tuple[Unplaced, ...]
    held: tuple[Unplaced, ...]
    workers: tuple[WorkerSummary, ...]
    averages: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    fitted: Mapping[str, Line] = field(default_factory=dict)  # lines fitted in this run (the leader keeps them)
    # Per worker and metric, its own base as this run knows it (load_model.own_base; the leader keeps them).
    own_excess: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def hold_balancing(self, stays: Callable[[str], bool], reason: UnplacedReason, detail: str) -> Plan:
        """The plan without the balancing moves of leases that `stays` names; each dropped move becomes held.

        Placing an unowned lease, failing over an expired one and draining a worker still move it.
        """
        return self.hold(lambda move: move.reason.is_balancing and stays(move.lease_key), reason, detail)

    def hold(self, stays: Callable[[Move], bool], reason: UnplacedReason, detail: str) -> Plan:
        """The plan without the moves `stays` picks; each dropped move becomes held (its lease keeps its owner)."""
        dropped = [move for move in self.moves if stays(move)]
        if not dropped:
            return self
        held = tuple(Unplaced(move.lease_key, move.from_owner, reason, detail) for move in dropped)
        return dataclasses.replace(self, moves=tuple(move for move in self.moves if move not in dropped),
                                   held=self.held + held)

    def moves_by_reason(self) -> dict[MoveReason, int]:
        """How many moves each reason produced (for the run summary)."""
        counts: dict[MoveReason, int] = {}
        for move in self.moves:
            counts[move.reason] = counts.get(move.reason, 0) + 1
        return counts
