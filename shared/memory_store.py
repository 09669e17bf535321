"""MemoryLeaseStore: the lease store held in process memory, for simulations and fast tests.

Same contract as the DynamoDB and SQL backends (docs/store-semantics.md): every write is one atomic conditional
operation under a single lock, fences are checked inside that lock, and a lost race is an `Outcome`, never an
exception. Rows are the model objects themselves (frozen), so malformed rows cannot occur and scans never report any.
Several store objects may share one `MemoryTables` (like clients of one endpoint); nothing survives the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.errors import StoreError
from shardherd.shared.lease import Lease
from shardherd.shared.rounding import round_throughput
from shardherd.shared.state_conditions import check_value, condition_holds
from shardherd.shared.store import (
    Conflict,
    Fence,
    LeaseScan,
    LeaseStore,
    Outcome,
    StateCondition,
    StateValue,
    TableNames,
    WorkerScan,
)
from shardherd.shared.worker import LeaseProgress, WorkerRecord, lease_progress_fields

# A lease write's condition: None when it holds, else the conflict to report.
Check = Callable[[Lease], Conflict | None]


@dataclass
class MemoryTables:
    """The three tables of one application: leases, worker records and coordinator state, under one lock."""

    leases: dict[str, Lease] = field(default_factory=dict)
    workers: dict[str, WorkerRecord] = field(default_factory=dict)
    state: dict[str, dict[str, StateValue]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)


class MemoryLeaseStore(LeaseStore):
    """Leases, worker records and coordinator state in dictionaries; thread-safe, one lock for everything."""

    def __init__(self, tables: TableNames, memory: MemoryTables | None = None) -> None:
        self.tables = tables
        self._db = memory if memory is not None else MemoryTables()

    # ---------------------------------------------------------------- schema
    def ensure_tables(self) -> None:
        """Nothing to create: the tables exist as soon as the store does."""

    def close(self) -> None:
        """Nothing to release (the data stays with its `MemoryTables`)."""

    # ---------------------------------------------------------------- lease reads
    def get_lease(self, lease_key: str) -> Lease | None:
        """The stored lease, or None."""
        with self._db.lock:
            return self._db.leases.get(lease_key)

    def scan_leases(self, page_size: int = 1000) -> LeaseScan:
        """Every lease in key order (one page or many makes no difference in memory, but the size is validated)."""
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise StoreError(f"page_size must be a positive integer, got {page_size!r}")
        with self._db.lock:
            return LeaseScan([self._db.leases[key] for key in sorted(self._db.leases)])

    def list_owned_keys(self, owner: str) -> list[str]:
        """Keys whose `leaseOwner` is `owner`, in key order."""
        with self._db.lock:
            return sorted(key for key, lease in self._db.leases.items() if lease.lease_owner == owner)

    # ---------------------------------------------------------------- lease writes
    def _write(self, lease_key: str, check: Check, change: Callable[[Lease], Lease],
               fence: Fence | None = None) -> Outcome:
        """Fence first, then existence, then the condition; apply `change` atomically when all hold."""
        with self._db.lock:
            current = self._db.leases.get(lease_key)
            if fence is not None and not condition_holds(fence.key, self._db.state.get(fence.key), fence.expect):
                return Outcome.lost(Conflict.FENCED, current)
            if current is None:
                return Outcome.lost(Conflict.NOT_FOUND, None)
            conflict = check(current)
            if conflict is not None:
                return Outcome.lost(conflict, current)
            updated = change(current)
            self._db.leases[lease_key] = updated
            return Outcome.ok(updated)

    def create_lease(self, lease: Lease) -> Outcome:
        """Insert the lease (counter 0, throughput rounded) unless its key exists."""
        stored = replace(lease, lease_counter=0, throughput_kbps=_rounded(lease.throughput_kbps))
        with self._db.lock:
            current = self._db.leases.get(lease.lease_key)
            if current is not None:
                return Outcome.lost(Conflict.ALREADY_EXISTS, current)
            self._db.leases[lease.lease_key] = stored
            return Outcome.ok(stored)

    def renew(self, lease_key: str, owner: str, expected_counter: int, throughput_kbps: float | None = None,
              during_handoff: bool = False) -> Outcome:
        """Counter+1 if the owner (or, during a handoff, the checkpoint owner) and the counter match."""
        tp = _rounded(throughput_kbps)

        def check(lease: Lease) -> Conflict | None:
            if lease.lease_counter != expected_counter:
                return Conflict.OWNERSHIP
            if during_handoff:
                return None if lease.checkpoint_owner == owner else Conflict.OWNERSHIP
            return None if lease.lease_owner == owner and lease.checkpoint_owner is None else Conflict.OWNERSHIP

        def change(lease: Lease) -> Lease:
            renewed = replace(lease, lease_counter=lease.lease_counter + 1)
            return renewed if tp is None else replace(renewed, throughput_kbps=tp)

        return self._write(lease_key, check, change)

    def assign(self, lease_key: str, new_owner: str, expected_owner: str | None,
               expected_checkpoint_owner: str | None, fence: Fence | None = None, move: str | None = None) -> Outcome:
        """Leader assignment conditioned on both owner fields (not the counter)."""
        switched = ((expected_owner is not None and expected_owner != new_owner)
                    or expected_checkpoint_owner == new_owner)

        def change(lease: Lease) -> Lease:
            return replace(lease, lease_owner=new_owner, checkpoint_owner=None, lease_counter=lease.lease_counter + 1,
                           owner_switches_since_checkpoint=lease.owner_switches_since_checkpoint + int(switched),
                           last_move=move)

        return self._write(lease_key, _owners_are(expected_owner, expected_checkpoint_owner), change, fence)

    def start_handoff(self, lease_key: str, new_owner: str, current_owner: str,
                      fence: Fence | None = None, move: str | None = None) -> Outcome:
        """Make `new_owner` the owner and `current_owner` the checkpoint owner; the counter is untouched."""
        return self._write(lease_key, _owners_are(current_owner, None),
                           lambda lease: replace(lease, lease_owner=new_owner, checkpoint_owner=current_owner,
                                                 last_move=move), fence)

    def complete_handoff(self, lease_key: str, checkpoint_owner: str) -> Outcome:
        """The old owner ends its handoff: checkpointOwner removed, counter+1, ownerSwitches+1."""

        def check(lease: Lease) -> Conflict | None:
            return None if lease.checkpoint_owner == checkpoint_owner else Conflict.OWNERSHIP

        def change(lease: Lease) -> Lease:
            return replace(lease, checkpoint_owner=None, lease_counter=lease.lease_counter + 1,
                           owner_switches_since_checkpoint=lease.owner_switches_since_checkpoint + 1)

        return self._write(lease_key, check, change)

    def checkpoint(self, lease_key: str, worker: str, checkpoint: Checkpoint,
                   progress: LeaseProgress | None = None, expected: Lease | None = None,
                   hand_over: bool = False) -> Outcome:
        """Record progress for the actual owner; STALE_CHECKPOINT if it would regress. KCL's pending fields go.

        `expected` is not needed: the row is read under the store's lock.
        """

        def check(lease: Lease) -> Conflict | None:
            if lease.actual_owner != worker:
                return Conflict.OWNERSHIP
            if checkpoint.regresses_from(lease.checkpoint):
                return Conflict.STALE_CHECKPOINT
            return None

        def change(lease: Lease) -> Lease:
            handing = hand_over and lease.checkpoint_owner == worker
            written = replace(lease, checkpoint=checkpoint, owner_switches_since_checkpoint=int(handing),
                              pending_checkpoint=None, pending_checkpoint_state=None,
                              lease_counter=lease.lease_counter + 1,
                              checkpoint_owner=None if handing else lease.checkpoint_owner)
            return written if progress is None else written.with_changes(**lease_progress_fields(progress))

        return self._write(lease_key, check, change)

    def release(self, lease_key: str, owner: str) -> Outcome:
        """The owner drops the lease (no handoff running): leaseOwner removed, counter+1."""
        return self._write(lease_key, _owners_are(owner, None),
                           lambda lease: replace(lease, lease_owner=None, lease_counter=lease.lease_counter + 1))

    def set_pause(self, lease_key: str, reason: str | None) -> Outcome:
        """Set the pause reason, or remove the pause and its acknowledgement; owners and counter untouched."""
        if reason is None:
            return self._write(lease_key, lambda lease: None,
                               lambda lease: replace(lease, paused=None, paused_by=None))
        return self._write(lease_key, lambda lease: None, lambda lease: replace(lease, paused=reason))

    def acknowledge_pause(self, lease_key: str, worker: str) -> Outcome:
        """`paused_by := worker` while paused and `worker` is the actual owner."""

        def check(lease: Lease) -> Conflict | None:
            return None if lease.is_paused and lease.actual_owner == worker else Conflict.OWNERSHIP

        return self._write(lease_key, check, lambda lease: replace(lease, paused_by=worker))

    def rewrite_checkpoint(self, lease_key: str, expected: Lease, checkpoint: Checkpoint,
                           fence: Fence | None = None) -> Outcome:
        """Any checkpoint for a paused lease still as `expected`; counter+1, pending fields removed."""

        def check(lease: Lease) -> Conflict | None:
            same = (lease.is_paused, lease.lease_owner, lease.checkpoint_owner, lease.checkpoint, lease.paused_by)
            wanted = (True, expected.lease_owner, expected.checkpoint_owner, expected.checkpoint, expected.paused_by)
            return None if same == wanted else Conflict.OWNERSHIP

        def change(lease: Lease) -> Lease:
            return replace(lease, checkpoint=checkpoint, pending_checkpoint=None, pending_checkpoint_state=None,
                           lease_counter=lease.lease_counter + 1)

        return self._write(lease_key, check, change, fence)

    def delete_lease(self, lease_key: str, expected_checkpoint: Checkpoint | None = None,
                     fence: Fence | None = None) -> Outcome:
        """Delete the lease (only while its checkpoint equals `expected_checkpoint`, if given); returns that row."""

        def check(lease: Lease) -> Conflict | None:
            if expected_checkpoint is not None and lease.checkpoint != expected_checkpoint:
                return Conflict.STALE_CHECKPOINT
            return None

        with self._db.lock:
            outcome = self._write(lease_key, check, lambda lease: lease, fence)
            if outcome.applied:
                del self._db.leases[lease_key]
            return outcome

    # ---------------------------------------------------------------- workers
    def upsert_worker(self, record: WorkerRecord) -> None:
        """Store the worker's own attributes; an operator's drain flag is kept."""
        with self._db.lock:
            previous = self._db.workers.get(record.worker_id)
            drain, restart = (previous.drain_requested, previous.restart_within_ms) if previous else (False, None)
            self._db.workers[record.worker_id] = _frozen_worker(record, drain, restart)

    def scan_workers(self) -> WorkerScan:
        """Every worker record, by id."""
        with self._db.lock:
            return WorkerScan([self._db.workers[wid] for wid in sorted(self._db.workers)])

    def get_worker(self, worker_id: str) -> WorkerRecord | None:
        """The stored record, or None."""
        with self._db.lock:
            return self._db.workers.get(worker_id)

    def set_drain_requested(self, worker_id: str, requested: bool) -> bool:
        """Set the operator's drain flag on an existing record; False if there is none."""
        return self._change_worker(worker_id, drain_requested=requested)

    def set_restart(self, worker_id: str, within_ms: int | None) -> bool:
        """Set or clear the restart reservation of an existing record; False if there is none."""
        return self._change_worker(worker_id, restart_within_ms=within_ms)

    def _change_worker(self, worker_id: str, **changes: Any) -> bool:
        with self._db.lock:
            current = self._db.workers.get(worker_id)
            if current is None:
                return False
            self._db.workers[worker_id] = replace(current, **changes)
            return True

    def delete_worker_if_unchanged(self, worker_id: str, last_update: int, heartbeat: int) -> bool:
        """Delete the record only while `lut` and `hb` are still the values read."""
        with self._db.lock:
            current = self._db.workers.get(worker_id)
            if current is None or current.last_update != last_update or current.heartbeat != heartbeat:
                return False
            del self._db.workers[worker_id]
            return True

    # ---------------------------------------------------------------- coordinator state
    def get_state(self, key: str, consistent: bool = True) -> dict[str, StateValue] | None:
        """A copy of the item's attributes, or None (always current: memory has no replicas)."""
        with self._db.lock:
            item = self._db.state.get(key)
            return None if item is None else dict(item)

    def put_state(self, key: str, attributes: Mapping[str, StateValue],
                  condition: StateCondition | None = None) -> bool:
        """Replace (or create) the whole item if the condition holds."""
        item = {name: check_value(name, value) for name, value in attributes.items()}
        with self._db.lock:
            if not condition_holds(key, self._db.state.get(key), condition):
                return False
            self._db.state[key] = item
            return True

    def update_state(self, key: str, set_attributes: Mapping[str, StateValue],
                     remove: Sequence[str] = (), condition: StateCondition | None = None) -> bool:
        """Set and remove attributes of an existing item if the condition holds."""
        changes = {name: check_value(name, value) for name, value in set_attributes.items()}
        for name in remove:
            check_value(name, "")
        with self._db.lock:
            item = self._db.state.get(key)
            if item is None or not condition_holds(key, item, condition):
                return False
            updated = {**item, **changes}
            for name in remove:
                updated.pop(name, None)
            self._db.state[key] = updated
            return True

    def delete_state(self, key: str, condition: StateCondition | None = None) -> bool:
        """Delete an existing item if the condition holds."""
        with self._db.lock:
            item = self._db.state.get(key)
            if item is None or not condition_holds(key, item, condition):
                return False
            del self._db.state[key]
            return True


def _owners_are(owner: str | None, checkpoint_owner: str | None) -> Check:
    def check(lease: Lease) -> Conflict | None:
        if lease.lease_owner == owner and lease.checkpoint_owner == checkpoint_owner:
            return None
        return Conflict.OWNERSHIP

    return check


def _rounded(throughput_kbps: float | None) -> float | None:
    """KCL's 6-decimal rounding; a NaN or infinite figure is a StoreError, as in the other backends."""
    if throughput_kbps is None:
        return None
    try:
        return round_throughput(throughput_kbps)
    except ValueError as exc:
        raise StoreError(str(exc)) from exc


def _frozen_worker(record: WorkerRecord, drain_requested: bool, restart_within_ms: int | None) -> WorkerRecord:
    """A copy that shares no mutable mapping with the caller, with the stored drain flag and restart reservation."""
    return replace(
        record,
        metric_stats={metric: tuple(values) for metric, values in record.metric_stats.items()},
        operating_range={metric: tuple(values) for metric, values in record.operating_range.items()},
        lease_throughput=dict(record.lease_throughput),
        lease_progress=dict(record.lease_progress),
        drain_requested=drain_requested,
        restart_within_ms=restart_within_ms,
    )
