"""The decider's input: a small, validated, immutable snapshot of leases and active workers for one leader run."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shardherd.coordinator.load_model import Line
from shardherd.shared.errors import ShardherdError
from shardherd.shared.lease import Lease
from shardherd.shared.worker import WorkerRecord


class InvalidSnapshot(ShardherdError, ValueError):
    """The snapshot handed to the decider is inconsistent (duplicate keys, negative or NaN throughput, ...)."""


@dataclass(frozen=True, slots=True)
class LeaseView:
    """What the decider needs of one lease.

    `expired` and `silent_ms` are the leader's own observations (how long it has seen no renewal or heartbeat on its
    monotonic clock), used for oldest-first priority ordering. `handoff_blocked` is True while a graceful handoff of
    this lease is still within its timeout; such a lease is never moved unless it is also expired (as in KCL).
    `recently_moved` is True for a lease that changed owner in the last few leader runs: balancing leaves it alone
    (no ping-pong), while drain and expiry may still move it. `refused_by` names workers that gave the lease back
    because they could not process it (their records report failed attempts): it goes elsewhere when it can.
    `settling` is True while the lease's reported figure is still changing (a shard that turned hot or quiet: the
    agents' throughput windows take tens of seconds to show it, the owner's CPU a few): band balancing leaves its
    owner alone until the figure settles, as it cannot yet price the owner's leases.
    `fresh` is True for a lease the leader placed (unassigned, expired, drained) in this term whose figure has not yet
    settled: moving it on costs nothing any report shows, so the fill on shares may move it while it settles.
    `reserved` is True while the owner's restart reservation holds (shared/restart.py): the lease is not expired and
    nothing moves it (pinned), so the owner resumes it when it is back.
    """

    key: str
    lease_owner: str | None = None
    checkpoint_owner: str | None = None
    throughput_kbps: float | None = None
    finished: bool = False
    expired: bool = False
    silent_ms: int = 0
    handoff_blocked: bool = False
    recently_moved: bool = False
    refused_by: frozenset[str] = frozenset()
    settling: bool = False
    fresh: bool = False
    reserved: bool = False

    def __post_init__(self) -> None:
        if not self.key:
            raise InvalidSnapshot("a lease has an empty key")
        tp = self.throughput_kbps
        if tp is not None and (math.isnan(tp) or tp < 0 or math.isinf(tp)):
            raise InvalidSnapshot(f"lease {self.key!r}: throughput must be a finite number >= 0, got {tp!r}")
        if self.silent_ms < 0:
            raise InvalidSnapshot(f"lease {self.key!r}: silent_ms must be >= 0, got {self.silent_ms}")
        if self.handoff_blocked and self.checkpoint_owner is None:
            raise InvalidSnapshot(f"lease {self.key!r}: handoff_blocked needs a checkpoint_owner")
        if self.reserved and (self.expired or self.actual_owner is None):
            raise InvalidSnapshot(f"lease {self.key!r}: a reserved lease has an owner and is not expired")

    @property
    def actual_owner(self) -> str | None:
        """The worker really processing the shard: checkpoint owner during a handoff, else the lease owner."""
        return self.checkpoint_owner if self.checkpoint_owner is not None else self.lease_owner

    def avoids(self, worker: str) -> bool:
        """True if `worker` should get this lease only when no other can: it expired under it, or it gave it back."""
        return (self.expired and worker == self.actual_owner) or worker in self.refused_by

    @property
    def needs_owner(self) -> bool:
        """True for leases priority assignment must place: unassigned or expired."""
        return self.expired or self.actual_owner is None

    @property
    def pinned(self) -> bool:
        """True if a pending handoff or a restart reservation forbids moving the lease in this run.

        Expired leases are never pinned (a reserved one is never expired).
        """
        return (self.handoff_blocked or self.reserved) and not self.expired

    @classmethod
    def from_lease(
        cls, lease: Lease, *, expired: bool = False, silent_ms: int = 0, handoff_blocked: bool = False,
        recently_moved: bool = False, refused_by: frozenset[str] = frozenset(), settling: bool = False,
        fresh: bool = False, reserved: bool = False, throughput_kbps: float | None = None,
    ) -> LeaseView:
        """A view of a stored lease plus the leader's observations of it.

        `throughput_kbps`, when known, replaces the figure stored on the lease (in `worker` liveness mode the owner's
        heartbeat reports a newer one).
        """
        return cls(
            key=lease.lease_key,
            lease_owner=lease.lease_owner,
            checkpoint_owner=lease.checkpoint_owner,
            throughput_kbps=lease.throughput_kbps if throughput_kbps is None else throughput_kbps,
            finished=lease.is_finished,
            expired=expired,
            silent_ms=silent_ms,
            handoff_blocked=handoff_blocked,
            recently_moved=recently_moved,
            refused_by=refused_by,
            settling=settling,
            fresh=fresh,
            reserved=reserved,
        )


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What the decider needs of one active worker: metric history (`sts`), operating range (`opr`), drain flag.

    `stale` is True for a worker the leader still counts as alive (its leases are not expired) whose heartbeat is
    older than a receiver's may be: it may have died, so it keeps its leases but receives none and gives none by
    balancing (a handoff to or from a dead worker stalls the shard until the handoff times out).

    `throughput_history` is the leader's record of the KiB/s the worker carried at each of its metric reports
    (oldest first, aligned with `metric_stats`): the decider compares its moving average with what the worker
    carries now to add the load its reports do not show yet (an averaged history lags a step change).
    `settled_reports` is how many of the newest reports the worker made while none of its lease figures was changing
    (`LeaseView.settling`: such a report counts CPU its throughput entry does not show yet); None: every report.
    """

    worker_id: str
    metric_stats: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    operating_range: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    draining: bool = False
    throughput_history: tuple[float, ...] = ()
    stale: bool = False
    settled_reports: int | None = None

    def __post_init__(self) -> None:
        if not self.worker_id:
            raise InvalidSnapshot("a worker has an empty id")

    @property
    def uses_default_metric(self) -> bool:
        """True when the worker reports no metric and is balanced by throughput share (KCL's default-metric workers)."""
        return not self.metric_stats and not self.operating_range

    @classmethod
    def from_record(cls, record: WorkerRecord, throughput_history: tuple[float, ...] = (),
                    stale: bool = False, settled_reports: int | None = None) -> WorkerView:
        """A view of a stored worker record (and the leader's observations of it)."""
        return cls(
            worker_id=record.worker_id,
            metric_stats=record.metric_stats,
            operating_range=record.operating_range,
            draining=record.is_draining,
            throughput_history=throughput_history,
            stale=stale,
            settled_reports=settled_reports,
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Leases (sorted by key) and active workers (sorted by id) for one run; duplicates are rejected.

    `lines` holds the last trustworthy metric/throughput line per metric the leader has seen fitted (this term),
    used when this run's points do not support a fit (a balanced fleet has too little spread in throughput).
    `own_excess` holds, per worker and metric, the own base the last run knew (`Plan.own_excess`): a worker's reports
    tell it only while their history spans a throughput change, and the history forgets.
    """

    leases: tuple[LeaseView, ...]
    workers: tuple[WorkerView, ...]
    lines: Mapping[str, Line] = field(default_factory=dict)
    own_excess: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        leases = tuple(sorted(self.leases, key=lambda lease: lease.key))
        workers = tuple(sorted(self.workers, key=lambda worker: worker.worker_id))
        for earlier, later in itertools.pairwise(leases):
            if earlier.key == later.key:
                raise InvalidSnapshot(f"lease {later.key!r} appears twice in the snapshot")
        for earlier_w, later_w in itertools.pairwise(workers):
            if earlier_w.worker_id == later_w.worker_id:
                raise InvalidSnapshot(f"worker {later_w.worker_id!r} appears twice in the snapshot")
        object.__setattr__(self, "leases", leases)
        object.__setattr__(self, "workers", workers)

    @classmethod
    def of(cls, leases: Iterable[LeaseView], workers: Iterable[WorkerView], lines: Mapping[str, Line] | None = None,
           own_excess: Mapping[str, Mapping[str, float]] | None = None) -> Snapshot:
        """A snapshot from any iterables of views (and the leader's last fitted lines and own bases)."""
        return cls(tuple(leases), tuple(workers), dict(lines or {}), dict(own_excess or {}))
