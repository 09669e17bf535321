"""CountingStore: a LeaseStore wrapper that counts store requests by kind, the cost figure of the fleet simulator.

DynamoDB bills every request, so the simulator reports requests per minute by kind. A lease scan costs one request
per page of `page_size` items (the in-memory store does not paginate, so pages are computed from the row count); the
worker table is scanned in pages of `WORKER_PAGE_ITEMS`. Every applied lease write is passed to `on_write`, which the
simulator uses to follow owner changes exactly; `before_owner_write` is called before each owner write (an assignment
or a handoff's start: the leader's) reaches the store, which the simulator uses to give it the store's time.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.lease import Lease
from shardherd.shared.store import Fence, LeaseScan, LeaseStore, Outcome, StateCondition, StateValue, WorkerScan
from shardherd.shared.worker import LeaseProgress, WorkerRecord

# Worker records with a 10-value CPU history are about 0.3-1 KiB; a 1 MiB scan page holds well over this many.
WORKER_PAGE_ITEMS = 1000

READ_KINDS = ("scan_page", "worker_scan_page", "get_lease", "gsi_query", "state_get")
WRITE_KINDS = ("renew", "heartbeat", "assign", "handoff_start", "handoff_complete", "checkpoint", "create", "delete",
               "release", "pause", "drain_flag", "worker_delete", "state_write")


def _pages(items: int, page_size: int) -> int:
    return max(1, math.ceil(items / page_size))


class CountingStore(LeaseStore):
    """Delegates every call to `inner` and counts it under a kind from READ_KINDS or WRITE_KINDS."""

    def __init__(self, inner: LeaseStore, on_write: Callable[[Outcome], None] | None = None,
                 before_owner_write: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.tables = inner.tables
        self.counts: Counter[str] = Counter()
        self._on_write = on_write
        self._before_owner_write = before_owner_write or (lambda: None)

    def reset(self) -> None:
        """Forget the counts so far (e.g. after a warm-up)."""
        self.counts.clear()

    def reads(self) -> int:
        """Read requests so far."""
        return sum(self.counts[kind] for kind in READ_KINDS)

    def writes(self) -> int:
        """Write requests so far."""
        return sum(self.counts[kind] for kind in WRITE_KINDS)

    def _wrote(self, kind: str, outcome: Outcome) -> Outcome:
        self.counts[kind] += 1
        if outcome.applied and self._on_write is not None:
            self._on_write(outcome)
        return outcome

    # ---------------------------------------------------------------- schema
    def ensure_tables(self) -> None:
        """Delegated, not counted (a deployment step, not a running cost)."""
        self.inner.ensure_tables()

    def close(self) -> None:
        """Delegated."""
        self.inner.close()

    # ---------------------------------------------------------------- lease reads
    def get_lease(self, lease_key: str) -> Lease | None:
        """One consistent GetItem."""
        self.counts["get_lease"] += 1
        return self.inner.get_lease(lease_key)

    def scan_leases(self, page_size: int = 1000) -> LeaseScan:
        """One request per page."""
        scan = self.inner.scan_leases(page_size)
        self.counts["scan_page"] += _pages(len(scan.leases) + len(scan.malformed), page_size)
        return scan

    def list_owned_keys(self, owner: str) -> list[str]:
        """One GSI Query (KEYS_ONLY items are small: one page)."""
        self.counts["gsi_query"] += 1
        return self.inner.list_owned_keys(owner)

    # ---------------------------------------------------------------- lease writes
    def create_lease(self, lease: Lease) -> Outcome:
        """Counted as `create`."""
        return self._wrote("create", self.inner.create_lease(lease))

    def renew(self, lease_key: str, owner: str, expected_counter: int, throughput_kbps: float | None = None,
              during_handoff: bool = False) -> Outcome:
        """Counted as `renew`."""
        return self._wrote("renew", self.inner.renew(lease_key, owner, expected_counter, throughput_kbps,
                                                     during_handoff))

    def assign(self, lease_key: str, new_owner: str, expected_owner: str | None,
               expected_checkpoint_owner: str | None, fence: Fence | None = None, move: str | None = None) -> Outcome:
        """Counted as `assign`."""
        self._before_owner_write()
        return self._wrote("assign", self.inner.assign(lease_key, new_owner, expected_owner,
                                                       expected_checkpoint_owner, fence, move))

    def start_handoff(self, lease_key: str, new_owner: str, current_owner: str,
                      fence: Fence | None = None, move: str | None = None) -> Outcome:
        """Counted as `handoff_start`."""
        self._before_owner_write()
        return self._wrote("handoff_start", self.inner.start_handoff(lease_key, new_owner, current_owner,
                                                                           fence, move))

    def complete_handoff(self, lease_key: str, checkpoint_owner: str) -> Outcome:
        """Counted as `handoff_complete`."""
        return self._wrote("handoff_complete", self.inner.complete_handoff(lease_key, checkpoint_owner))

    def checkpoint(self, lease_key: str, worker: str, checkpoint: Checkpoint,
                   progress: LeaseProgress | None = None, expected: Lease | None = None,
                   hand_over: bool = False) -> Outcome:
        """Counted as `checkpoint`."""
        return self._wrote("checkpoint", self.inner.checkpoint(lease_key, worker, checkpoint, progress, expected,
                                                               hand_over))

    def release(self, lease_key: str, owner: str) -> Outcome:
        """Counted as `release`."""
        return self._wrote("release", self.inner.release(lease_key, owner))

    def set_pause(self, lease_key: str, reason: str | None) -> Outcome:
        """Counted as `pause`."""
        return self._wrote("pause", self.inner.set_pause(lease_key, reason))

    def acknowledge_pause(self, lease_key: str, worker: str) -> Outcome:
        """Counted as `pause`."""
        return self._wrote("pause", self.inner.acknowledge_pause(lease_key, worker))

    def rewrite_checkpoint(self, lease_key: str, expected: Lease, checkpoint: Checkpoint,
                           fence: Fence | None = None) -> Outcome:
        """Counted as `checkpoint`."""
        return self._wrote("checkpoint", self.inner.rewrite_checkpoint(lease_key, expected, checkpoint, fence))

    def delete_lease(self, lease_key: str, expected_checkpoint: Checkpoint | None = None,
                     fence: Fence | None = None) -> Outcome:
        """Counted as `delete`."""
        return self._wrote("delete", self.inner.delete_lease(lease_key, expected_checkpoint, fence))

    # ---------------------------------------------------------------- workers
    def upsert_worker(self, record: WorkerRecord) -> None:
        """Counted as `heartbeat` (every worker-record write)."""
        self.counts["heartbeat"] += 1
        self.inner.upsert_worker(record)

    def scan_workers(self) -> WorkerScan:
        """One request per page of WORKER_PAGE_ITEMS records."""
        scan = self.inner.scan_workers()
        self.counts["worker_scan_page"] += _pages(len(scan.workers) + len(scan.malformed), WORKER_PAGE_ITEMS)
        return scan

    def get_worker(self, worker_id: str) -> WorkerRecord | None:
        """Counted as `get_worker` (one GetItem)."""
        self.counts["get_worker"] += 1
        return self.inner.get_worker(worker_id)

    def set_drain_requested(self, worker_id: str, requested: bool) -> bool:
        """Counted as `drain_flag`."""
        self.counts["drain_flag"] += 1
        return self.inner.set_drain_requested(worker_id, requested)

    def set_restart(self, worker_id: str, within_ms: int | None) -> bool:
        """Counted as `restart_reservation`."""
        self.counts["restart_reservation"] += 1
        return self.inner.set_restart(worker_id, within_ms)

    def delete_worker_if_unchanged(self, worker_id: str, last_update: int, heartbeat: int) -> bool:
        """Counted as `worker_delete`."""
        self.counts["worker_delete"] += 1
        return self.inner.delete_worker_if_unchanged(worker_id, last_update, heartbeat)

    # ---------------------------------------------------------------- coordinator state
    def get_state(self, key: str, consistent: bool = True) -> dict[str, StateValue] | None:
        """Counted as `state_get` (the leader lock's reads)."""
        self.counts["state_get"] += 1
        return self.inner.get_state(key, consistent)

    def put_state(self, key: str, attributes: Mapping[str, StateValue],
                  condition: StateCondition | None = None) -> bool:
        """Counted as `state_write`."""
        self.counts["state_write"] += 1
        return self.inner.put_state(key, attributes, condition)

    def update_state(self, key: str, set_attributes: Mapping[str, StateValue],
                     remove: Sequence[str] = (), condition: StateCondition | None = None) -> bool:
        """Counted as `state_write` (the leader lock's heartbeats)."""
        self.counts["state_write"] += 1
        return self.inner.update_state(key, set_attributes, remove, condition)

    def delete_state(self, key: str, condition: StateCondition | None = None) -> bool:
        """Counted as `state_write`."""
        self.counts["state_write"] += 1
        return self.inner.delete_state(key, condition)
