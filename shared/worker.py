"""Worker records: heartbeat, CPU history and operating range (KCL's WorkerMetricStats) plus shardherd's extras."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shardherd.shared.row_checks import InvalidRowValue, count_problem, throughput_problem

# KCL's metric short names (`WorkerMetricStats`).
CPU_METRIC = "C"
MEMORY_METRIC = "M"
NETWORK_IN_METRIC = "NI"
NETWORK_OUT_METRIC = "NO"
THROUGHPUT_METRIC = "T"

# A stored metric value of -1 means "sampling failed for that interval" (as in KCL).
FAILED_SAMPLE = -1.0


MAX_FAILING_ERROR_CHARS = 120  # of a failing batch's last error in the row (which stays under one write unit)


@dataclass(frozen=True, slots=True)
class FailingBatch:
    """A shard stuck on a batch its processor keeps failing: since when (wall seconds), attempts, the last error."""

    since: float
    attempts: int
    last_error: str


@dataclass(frozen=True, slots=True)
class PoisonReport:
    """A shard's poison records as its owner reports them (decision 0031): bounded, never a growing list.

    `blocked_on` is the record ("SEQUENCE/SUB") the shard is blocked on now (policy block, or a quarantine write
    failing); `quarantined` counts the records written to the poison destination and checkpointed past since the owner
    took the lease; `last_quarantined` and `last_object` name the newest of them and its object at the destination.
    """

    blocked_on: str | None = None
    quarantined: int = 0
    last_quarantined: str | None = None
    last_object: str | None = None

    def __post_init__(self) -> None:
        problem = count_problem(self.quarantined)
        if problem is not None:
            raise InvalidRowValue(f"poison report: {problem}")


@dataclass(frozen=True, slots=True)
class LeaseProgress:
    """What the owner reports of one lease besides throughput: lag and totals since it started holding the lease.

    `failures` counts attempts to process the lease that failed on this worker (processor factory or initialize()
    raised, shard not found, no start position). `refused` is True once the worker gave the lease back after its
    attempts ran out; it keeps reporting it for a while so the leader gives the lease to another worker if any.
    `records_behind` is how many records wait after the owner's position, where the owner knows it exactly (it read
    up to the stream's tip), else None. `throttled` counts the owner's read calls on the shard that Kinesis throttled
    in the last THROTTLE_WINDOW_SECONDS (the per-shard read limits are shared by every application reading it).
    `stalled` is True while the lease's reader on this worker has made no progress for its red bound
    (agent/stall_watch.py): the leader counts such workers to tell a fleet-wide stall from a local one
    (coordinator/fleet_stall.py).
    """

    millis_behind_latest: int | None = None
    records: int = 0
    bytes: int = 0
    failures: int = 0
    refused: bool = False
    records_behind: int | None = None
    failing: FailingBatch | None = None  # the shard is stuck on a failing batch (decision 0022)
    poison: PoisonReport | None = None  # a poison record blocking it, records quarantined (decision 0031)
    checkpointed_at_millis: int | None = None  # stamped by the keeper as it writes a checkpoint (epoch ms)
    throttled: int = 0  # read calls throttled in the last THROTTLE_WINDOW_SECONDS
    stalled: bool = False  # its reader here made no progress for the red bound (decision 0039)

    def __post_init__(self) -> None:
        problem = (count_problem(self.millis_behind_latest, allow_none=True) or count_problem(self.records)
                   or count_problem(self.bytes) or count_problem(self.failures) or count_problem(self.throttled)
                   or count_problem(self.records_behind, allow_none=True)
                   or count_problem(self.checkpointed_at_millis, allow_none=True))
        if problem is not None:
            raise InvalidRowValue(f"lease progress: {problem}")


THROTTLE_WINDOW_SECONDS = 60.0  # the window of LeaseProgress.throttled
NO_PROGRESS = LeaseProgress()
NO_POISON = PoisonReport()


def troubled(progress: Mapping[str, LeaseProgress]) -> dict[str, LeaseProgress]:
    """The entries a worker row carries: leases failed on, refused, stuck, throttled lately, stalled or with poison.

    Lag, records and bytes go onto the lease with each checkpoint instead, so the heartbeat row stays under one write
    unit (1 KiB) however many leases the worker holds without trouble.
    """
    return {key: value for key, value in progress.items() if value.failures or value.refused or value.failing
            or value.poison or value.throttled or value.stalled}


def lease_progress_fields(progress: LeaseProgress) -> dict[str, int | None]:
    """The Lease fields (and SQL lease columns) a checkpoint sets from the owner's progress."""
    return {"millis_behind_latest": progress.millis_behind_latest, "records_processed": progress.records,
            "bytes_processed": progress.bytes, "records_behind": progress.records_behind,
            "checkpointed_at_millis": progress.checkpointed_at_millis}


class WorkerState(enum.Enum):
    """What the worker says about itself."""

    ACTIVE = "ACTIVE"
    DRAINING = "DRAINING"


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """One worker's row in `<app>-WorkerMetricStats`.

    KCL attributes: `wid`, `lut` (epoch seconds), `sts` (metric -> recent per-interval averages, oldest first), `opr`
    (metric -> [max utilisation %]). shardherd adds `hb` (a heartbeat counter the leader watches change on its own
    clock, so clocks are never compared across hosts), `workerState`, `leaseThroughput` (lease key -> KiB/s, used in
    `worker` liveness mode where leases are not renewed), `leaseProgress` (lease key -> lag, records, bytes; for
    operators), `drainRequested` (set by operators, never by the worker) and `restartWithinMillis` (a restart
    reservation, shared/restart.py: set by the stopping worker or an operator, never by a heartbeat). `repairs` says
    what a decoder had to drop or mark failed in the stored row (see shared/row_checks.py); it is never stored.
    Construction enforces what every consumer assumes: a non-empty id, finite metric values, usable lease throughputs
    (InvalidRowValue otherwise).
    """

    worker_id: str
    last_update: int
    metric_stats: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    operating_range: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    heartbeat: int = 0
    state: WorkerState = WorkerState.ACTIVE
    lease_throughput: Mapping[str, float] = field(default_factory=dict)
    drain_requested: bool = False
    lease_progress: Mapping[str, LeaseProgress] = field(default_factory=dict)
    restart_within_ms: int | None = None
    repairs: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not self.worker_id:
            raise InvalidRowValue("a worker record needs a non-empty id")
        if (problem := count_problem(self.restart_within_ms, allow_none=True)) is not None:
            raise InvalidRowValue(f"worker {self.worker_id!r}: restart window {problem}")
        for name, series in (("metric", self.metric_stats), ("operating range", self.operating_range)):
            for metric, values in series.items():
                if not all(math.isfinite(value) for value in values):
                    raise InvalidRowValue(f"worker {self.worker_id!r}: {name} {metric} has a non-finite value")
        for key, kbps in self.lease_throughput.items():
            if (problem := throughput_problem(kbps)) is not None:
                raise InvalidRowValue(f"worker {self.worker_id!r}: throughput of {key!r} {problem}")

    @property
    def uses_default_metric(self) -> bool:
        """True when the worker reports no metric, so the leader balances it by throughput (KCL's default metric)."""
        return not self.metric_stats and not self.operating_range

    @property
    def is_draining(self) -> bool:
        """True if the worker or an operator asked for all of its leases to move away."""
        return self.state is WorkerState.DRAINING or self.drain_requested


def common_metric_kinds(reports: Iterable[Mapping[str, object]]) -> frozenset[str]:
    """The metric kinds every worker reports (pass each worker's `sts` map): the only basis they can be balanced on.

    KCL averages each metric over the workers that report it, so in a fleet mixing kinds (a KCL worker without CPU
    next to a shardherd agent with CPU) every worker sits at its own metric's average and nothing ever looks out of
    balance. Balancing only on kinds every worker reports avoids that; when one worker reports none (a KCL
    "default metric" worker), the common basis is the throughput share, which every worker has.
    """
    common: frozenset[str] | None = None
    for report in reports:
        kinds = frozenset(report)
        common = kinds if common is None else common & kinds
    return common or frozenset()
