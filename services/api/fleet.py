"""The fleet as one replica sees it: workers with liveness judged on this replica's clock, leases with their state."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from shardherd.coordinator.leader_loop import reported_throughput
from shardherd.coordinator.liveness import ChangeWatcher, WorkerGrace, heartbeat_age, worker_version
from shardherd.services.api.models import LeaseOut, LeaseState, MalformedRow, WorkerOut, WorkerStateName
from shardherd.shared.clock import Clock
from shardherd.shared.config import Settings
from shardherd.shared.lease import Lease
from shardherd.shared.restart import reserved
from shardherd.shared.store import LeaseScan, WorkerScan
from shardherd.shared.streams import stream_name_of
from shardherd.shared.worker import CPU_METRIC, NO_POISON, NO_PROGRESS, LeaseProgress, WorkerRecord
from shardherd.shared.worker_metrics import ema


class HeartbeatObserver:
    """Heartbeat ages on this replica's monotonic clock, by the leader's own rule (shardherd.coordinator.liveness)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._watcher = ChangeWatcher()
        self._guard = threading.Lock()

    def ages(self, workers: list[WorkerRecord], at: float | None = None) -> dict[str, float]:
        """Seconds since each worker's record last changed, as of `at` (when the rows were read; default now).

        Workers no longer listed are forgotten.
        """
        now, wall = self._clock.monotonic(), self._clock.time()
        if at is not None and at < now:
            now, wall = at, wall - (now - at)
        with self._guard:
            self._watcher.observe({worker.worker_id: worker_version(worker) for worker in workers}, now)
            return {worker.worker_id: heartbeat_age(self._watcher, worker, now, wall) for worker in workers}


RATE_WINDOW_SECONDS = 30.0  # records/s: over the checkpoints seen in this window ...
MIN_RATE_SPAN_SECONDS = 5.0  # ... once they span at least this long


@dataclass(frozen=True, slots=True)
class CheckpointMotion:
    """When a lease's checkpoint took its current value (wall clock) and the records/s of its owner's checkpoints."""

    moved_at: float
    records_per_second: float | None


class CheckpointAges:
    """When each lease's checkpoint last moved and how fast its records go, from the checkpoints' own progress.

    A checkpoint's time is the one its owner stored with it (`checkpoint_written_at`: shardherd agents stamp every
    checkpoint), so the age is exact as of the scan. A checkpoint without one, or whose stored time did not change with
    its value (a KCL worker's checkpoint leaves shardherd's attribute as it was), counts from when this replica first
    saw the value (the scan's time, on the wall clock). The rate is the records the owner
    reported (`records_processed`, stored with each checkpoint; from older agents, in the heartbeat) between the oldest
    and the newest figure seen in the last RATE_WINDOW_SECONDS, over the time between them: figures of the data, not of
    when a page happened to poll, so a reading never drops to 0 because two polls saw the same cached scan. A shard
    whose checkpoint has not moved for the whole window reads 0; a new owner starts a new series.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._seen: dict[str, tuple[str, float, float | None]] = {}  # key -> (checkpoint, since, stored time)
        self._newest = 0.0  # wall time of the newest scan seen
        self._samples: dict[str, list[tuple[float, int, str | None]]] = {}  # (wall, records, holder), oldest first
        self._guard = threading.Lock()

    def motions(self, leases: list[LeaseOut], at: float | None = None) -> dict[str, CheckpointMotion]:
        """Lease key -> CheckpointMotion as of `at` (the scan's monotonic time; default now); others are forgotten."""
        wall = self._wall(at)
        with self._guard:
            if wall < self._newest:  # an older scan (the leader's view) after a newer read must not undo it
                return {key: CheckpointMotion(since, _rate(self._samples.get(key, []), wall))
                        for key, (_, since, _) in self._seen.items()}
            self._newest = wall
            seen: dict[str, tuple[str, float, float | None]] = {}
            samples: dict[str, list[tuple[float, int, str | None]]] = {}
            for lease in leases:
                seen[lease.lease_key] = _moved(self._seen.get(lease.lease_key), lease, wall)
                samples[lease.lease_key] = _sampled(self._samples.get(lease.lease_key, []), lease, wall)
            self._seen, self._samples = seen, samples
            return {key: CheckpointMotion(since, _rate(samples[key], wall)) for key, (_, since, _) in seen.items()}

    def _wall(self, at: float | None) -> float:
        now = self._clock.monotonic()
        return self._clock.time() - (now - min(at, now) if at is not None else 0.0)


def _moved(before: tuple[str, float, float | None] | None, lease: LeaseOut,
           wall: float) -> tuple[str, float, float | None]:
    """(checkpoint, since when, its stored time): kept while the value stays, else from the owner's stamp if new."""
    value, written = str(lease.checkpoint), lease.checkpoint_written_at
    if before is not None and before[0] == value:
        return before
    if written is not None and (before is None or written != before[2]):
        return value, min(written, wall), written
    return value, wall, written


def _sampled(samples: list[tuple[float, int, str | None]], lease: LeaseOut,
             wall: float) -> list[tuple[float, int, str | None]]:
    """The lease's samples with this scan's figure added when it moved; older than the window dropped."""
    records, holder = lease.records_processed, lease.checkpoint_owner or lease.owner
    if records is None:
        return []
    if samples and (samples[-1][2] != holder or records < samples[-1][1]):
        samples = []  # a new owner counts from its takeover
    if not samples or records != samples[-1][1]:
        samples = [*samples, (wall, records, holder)]
    keep = [sample for sample in samples if sample[0] >= wall - RATE_WINDOW_SECONDS]
    return keep or samples[-1:]


def _rate(samples: list[tuple[float, int, str | None]], wall: float) -> float | None:
    """Records/s over the window; 0 for a checkpoint that did not move in the whole window; None while unknown."""
    if not samples:
        return None
    if wall - samples[-1][0] >= RATE_WINDOW_SECONDS:
        return 0.0
    span = samples[-1][0] - samples[0][0]
    if span < MIN_RATE_SPAN_SECONDS:
        return None
    return round((samples[-1][1] - samples[0][1]) / span, 1)


@dataclass(frozen=True, slots=True)
class Fleet:
    """Workers and leases (sorted by id and key) and the rows that could not be read."""

    workers: list[WorkerOut]
    leases: list[LeaseOut]
    malformed_workers: list[MalformedRow]
    malformed_leases: list[MalformedRow]
    repaired_workers: list[MalformedRow]
    repaired_leases: list[MalformedRow]


def judge_fleet(lease_scan: LeaseScan, worker_scan: WorkerScan, settings: Settings, heartbeats: HeartbeatObserver,
                grace: WorkerGrace, checkpoints: CheckpointAges | None = None, at: float | None = None) -> Fleet:
    """The fleet as scanned (by the API or by the leader's last run), judged on this replica's clock.

    A worker is expired once its row is older than the grace the leader gives its kind of worker (WorkerGrace).
    Ages are as of `at`, the monotonic time of the scans (default now): the leader's view may be a full-scan
    interval old, and its rows are judged as the leader judged them then.
    """
    records = {worker.worker_id: worker for worker in worker_scan.workers}
    ages = heartbeats.ages(worker_scan.workers, at)
    expired = {wid for wid, age in ages.items() if age > grace.of(records[wid])}
    # Silent workers whose leases a restart reservation keeps (shared/restart.py): not expired, "restarting".
    away = {wid for wid in expired if reserved(records[wid], ages[wid])}
    expired -= away
    leases = [_lease_out(lease, records, expired, settings, away) for lease in lease_scan.leases]
    if checkpoints is not None:
        motions = checkpoints.motions(leases, at)
        leases = [lease.model_copy(update=_motion_fields(motions.get(lease.lease_key))) for lease in leases]
    leases.sort(key=lambda item: item.lease_key)
    workers = [_worker_out(records[wid], ages[wid], wid in expired, leases, settings, wid in away)
               for wid in sorted(records)]
    return Fleet(workers, leases, *_unreadable_and_repaired(lease_scan, worker_scan))


def _unreadable_and_repaired(lease_scan: LeaseScan, worker_scan: WorkerScan) -> tuple[
        list[MalformedRow], list[MalformedRow], list[MalformedRow], list[MalformedRow]]:
    """Fleet's malformed workers and leases, then its repaired ones, as rows with their reasons."""
    return ([MalformedRow(key=row.worker_id, reason=row.reason) for row in worker_scan.malformed],
            [MalformedRow(key=row.lease_key, reason=row.reason) for row in lease_scan.malformed],
            [MalformedRow(key=w.worker_id, reason="; ".join(w.repairs)) for w in worker_scan.workers if w.repairs],
            [MalformedRow(key=lease.lease_key, reason="; ".join(lease.repairs)) for lease in lease_scan.leases
             if lease.repairs])


def _motion_fields(motion: CheckpointMotion | None) -> dict[str, float | None]:
    if motion is None:
        return {}
    return {"checkpoint_moved_at": motion.moved_at, "records_per_second": motion.records_per_second}


def _lease_state(lease: Lease, records: dict[str, WorkerRecord], expired: set[str], settings: Settings,
                 away: set[str]) -> LeaseState:
    if lease.is_finished:
        return "finished"
    owner = lease.actual_owner
    if owner is None:
        return "unassigned"
    if owner in away:
        return "reserved"
    if owner in expired or (owner not in records and settings.liveness_mode == "worker"):
        return "expired"
    return "handoff" if lease.in_handoff else "owned"


def _progress(lease: Lease, owner: WorkerRecord | None) -> LeaseProgress | None:
    """The owner's progress as of its last checkpoint (on the lease), else what an older agent's row reports."""
    if lease.records_processed is not None:
        return LeaseProgress(lease.millis_behind_latest, lease.records_processed, lease.bytes_processed or 0,
                             records_behind=lease.records_behind)
    return owner.lease_progress.get(lease.lease_key) if owner is not None else None


def _lease_out(lease: Lease, records: dict[str, WorkerRecord], expired: set[str], settings: Settings,
               away: set[str]) -> LeaseOut:
    owner = records.get(lease.actual_owner or "")
    progress = _progress(lease, owner)
    return LeaseOut(
        lease_key=lease.lease_key, stream=stream_name_of(lease) or settings.stream_name, shard_id=lease.shard,
        owner=lease.lease_owner, checkpoint_owner=lease.checkpoint_owner,
        state=_lease_state(lease, records, expired, settings, away), checkpoint=str(lease.checkpoint),
        lease_counter=lease.lease_counter, owner_switches_since_checkpoint=lease.owner_switches_since_checkpoint,
        throughput_kbps=reported_throughput(lease, records), parent_shard_ids=sorted(lease.parent_shard_ids),
        child_shard_ids=sorted(lease.child_shard_ids), explanation=None,
        millis_behind_latest=progress.millis_behind_latest if progress else None,
        records_behind=progress.records_behind if progress else None,
        records_processed=progress.records if progress else None,
        bytes_processed=progress.bytes if progress else None,
        checkpoint_written_at=None if lease.checkpointed_at_millis is None else lease.checkpointed_at_millis / 1000,
        paused=lease.paused, paused_by=lease.paused_by, **_trouble(lease, owner),
    )


def _trouble(lease: Lease, owner: WorkerRecord | None) -> dict[str, Any]:
    """The LeaseOut fields of what the owner's row reports of the lease: throttled, stalled, a failing batch, poison.

    Without a row they are null; with a row that reports nothing of the lease, none (0, false).
    """
    reported = None if owner is None else owner.lease_progress.get(lease.lease_key, NO_PROGRESS)
    failing = reported.failing if reported is not None else None
    poison = (reported.poison if reported is not None else None) or NO_POISON  # decision 0031
    return {"read_throttled": reported.throttled if reported is not None else None,
            "read_stalled": reported.stalled if reported is not None else None,
            "failing_since": failing.since if failing else None,
            "failing_attempts": failing.attempts if failing else None,
            "failing_error": failing.last_error if failing else None,
            "poison_blocked_on": poison.blocked_on, "quarantined_records": poison.quarantined,
            "last_quarantined": poison.last_quarantined, "last_quarantined_object": poison.last_object}


def _worker_out(record: WorkerRecord, age: float, expired: bool, leases: list[LeaseOut],
                settings: Settings, away: bool) -> WorkerOut:
    state: WorkerStateName = ("restarting" if away else "expired" if expired
                              else "draining" if record.is_draining else "active")
    mine = [lease for lease in leases
            if (lease.checkpoint_owner or lease.owner) == record.worker_id and lease.state != "finished"]
    cpu = list(record.metric_stats.get(CPU_METRIC, ()))
    return WorkerOut(
        worker_id=record.worker_id, state=state, reported_state=record.state.value,
        drain_requested=record.drain_requested, restart_within_ms=record.restart_within_ms,
        heartbeat=record.heartbeat, heartbeat_age_seconds=round(age, 3),
        last_update=record.last_update, cpu_history=cpu,
        cpu_ema=ema(cpu, settings.worker_metrics_ema_alpha) if cpu else None,
        metrics={name: list(values) for name, values in record.metric_stats.items()},
        operating_range={name: list(values) for name, values in record.operating_range.items()},
        throughput_kbps=sum(lease.throughput_kbps or 0.0 for lease in mine), lease_count=len(mine),
    )

