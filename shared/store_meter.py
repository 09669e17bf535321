"""StoreMeter: a LeaseStore wrapper that counts DynamoDB capacity units the way DynamoDB bills them, by caller.

Whatever the backend underneath (DynamoDB, SQL, memory), every call is priced as the DynamoDB backend would send it
(docs/store-cost.md): item sizes follow DynamoDB's rules on the item the DynamoDB backend stores (attribute names plus
values; numbers by significant digits; lists and maps with their overheads), a write costs one unit per started KiB of
the larger of the item before and after, a strongly consistent read one unit per started 4 KiB (half for eventually
consistent reads, and for every owner-index query), scans and queries per page, transactions double, and a write that
changes `leaseOwner` also writes the owner index (two entries when the owner changes, one when it appears or goes).
A lost conditional write still costs the size of the item it found.

Counts are kept per (caller, table, operation). The caller comes from a context variable (`acting_as("leader")`), so
one process's leader loop, API handlers and metrics scrapes are told apart without threading it through every call.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.dynamo.expressions import AttributeValue
from shardherd.shared.dynamo.lease_codec import encode_lease
from shardherd.shared.dynamo.state_codec import encode_state
from shardherd.shared.dynamo.worker_codec import encode_worker
from shardherd.shared.lease import Lease
from shardherd.shared.store import Fence, LeaseScan, LeaseStore, Outcome, StateCondition, StateValue, WorkerScan
from shardherd.shared.worker import LeaseProgress, WorkerRecord

WRITE_UNIT_BYTES = 1024
READ_UNIT_BYTES = 4096
PAGE_BYTES = 1024 * 1024  # a Scan or Query page stops at 1 MB of items read
INDEX_TABLE = "owner-index"  # the table label of owner-index writes and queries
DUMP_SECONDS = 2.0  # how often a dumping meter writes its report

_caller: contextvars.ContextVar[str | None] = contextvars.ContextVar("store_caller", default=None)


@contextlib.contextmanager
def acting_as(caller: str) -> Iterator[None]:
    """Attribute every metered store call made inside the block (in this thread or task) to `caller`."""
    token = _caller.set(caller)
    try:
        yield
    finally:
        _caller.reset(token)


def current_caller(default: str = "other") -> str:
    """The caller store calls are attributed to right now (`default` outside any `acting_as` block)."""
    return _caller.get() or default


# ------------------------------------------------------------------------------------------------ DynamoDB sizes
def _number_size(text: str) -> int:
    """A number's size: about one byte per two significant digits, plus one (leading/trailing zeros free)."""
    digits = Decimal(text).normalize().as_tuple().digits
    significant = len(digits) if any(digits) else 1
    return math.ceil(significant / 2) + 1


def value_size(value: AttributeValue) -> int:
    """Bytes of one attribute value by DynamoDB's item-size rules."""
    kind, content = next(iter(value.items()))
    if kind == "S":
        return len(str(content).encode())
    if kind == "N":
        return _number_size(str(content))
    if kind == "B":
        return len(content)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(str(item).encode()) for item in content)
    if kind == "NS":
        return sum(_number_size(str(item)) for item in content)
    if kind == "BS":
        return sum(len(item) for item in content)
    if kind == "L":
        return 3 + sum(1 + value_size(item) for item in content)
    if kind == "M":
        return 3 + sum(1 + len(name.encode()) + value_size(item) for name, item in content.items())
    raise ValueError(f"unknown DynamoDB attribute type {kind!r}")


def item_size(item: Mapping[str, AttributeValue]) -> int:
    """Bytes of an item: every attribute name (UTF-8) plus its value."""
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


def write_units(size: int, transactional: bool = False) -> float:
    """Write units of one item write: one per started KiB (at least one), doubled inside a transaction."""
    units = max(1, math.ceil(size / WRITE_UNIT_BYTES))
    return float(units * (2 if transactional else 1))


def read_units(size: int, consistent: bool) -> float:
    """Read units of one read (an item, or a scan/query page): one per started 4 KiB, half when eventual."""
    units = max(1, math.ceil(size / READ_UNIT_BYTES))
    return units if consistent else units / 2


def paged_read_units(sizes: Sequence[int], page_items: int, consistent: bool) -> tuple[int, float]:
    """(pages, read units) of a paginated scan or query over items of `sizes` with `Limit=page_items`."""
    pages, units, in_page, page_bytes = 0, 0.0, 0, 0
    for size in sizes:
        if in_page and (in_page >= page_items or page_bytes + size > PAGE_BYTES):
            pages, units = pages + 1, units + read_units(page_bytes, consistent)
            in_page, page_bytes = 0, 0
        in_page, page_bytes = in_page + 1, page_bytes + size
    return pages + 1, units + read_units(page_bytes, consistent)  # an empty scan still reads one page


def lease_size(lease: Lease) -> int:
    """Bytes of the lease item the DynamoDB backend stores."""
    return item_size(encode_lease(lease))


def worker_size(record: WorkerRecord) -> int:
    """Bytes of the worker item the DynamoDB backend stores."""
    return item_size(encode_worker(record))


def state_size(key: str, attributes: Mapping[str, StateValue]) -> int:
    """Bytes of a coordinator-state item."""
    return item_size(encode_state(key, attributes))


def index_entry_size(lease_key: str, owner: str) -> int:
    """Bytes of one KEYS_ONLY owner-index entry as a query reads it (`leaseOwner` and `leaseKey`)."""
    return len("leaseOwner") + len(owner.encode()) + len("leaseKey") + len(lease_key.encode())


def _index_writes(before: str | None, after: str | None) -> int:
    """Owner-index entries written when `leaseOwner` goes from `before` to `after`."""
    if before == after:
        return 0
    return 2 if before is not None and after is not None else 1


# ------------------------------------------------------------------------------------------------ the meter
@dataclass(slots=True)
class Usage:
    """Requests and capacity units of one (caller, table, operation)."""

    requests: int = 0
    read_units: float = 0.0
    write_units: float = 0.0

    def add(self, other: Usage | UsageRow) -> Usage:
        """Count `other` in too; returns self."""
        self.requests += other.requests
        self.read_units += other.read_units
        self.write_units += other.write_units
        return self


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One line of a meter report: a (caller, table, operation) and its requests and units."""

    caller: str
    table: str
    operation: str
    requests: int
    read_units: float
    write_units: float


class StoreMeter(LeaseStore):
    """Delegates every call to `inner` and prices it in DynamoDB capacity units under the current caller.

    `consistent_reads` is the DynamoDB backend's setting for lease reads and scans (coordinator-state and worker
    GetItems are always consistent, owner-index queries never). Item sizes before a write are remembered from what
    this meter saw (reads and writes); an item it never saw is priced by its size after the write.
    """

    def __init__(self, inner: LeaseStore, consistent_reads: bool = True, lease_page_items: int = 1000,
                 worker_page_items: int = 1000, default_caller: str = "other", dump_path: Path | None = None,
                 dump_seconds: float = DUMP_SECONDS) -> None:
        self.inner = inner
        self.default_caller = default_caller
        self._dump_path = dump_path
        self._stop_dumping = threading.Event()
        if dump_path is not None:
            threading.Thread(target=self._dump_every, args=(dump_seconds,), name="store-meter",
                             daemon=True).start()
        self.tables = inner.tables
        self.consistent_reads = consistent_reads
        self._worker_page_items = worker_page_items
        self._lease_page_items = lease_page_items
        self._usage: dict[tuple[str, str, str], Usage] = {}
        self._sizes: dict[tuple[str, str], int] = {}
        self._owners: dict[str, str | None] = {}
        self._state_items: dict[str, dict[str, StateValue]] = {}
        self._guard = threading.Lock()

    # ---------------------------------------------------------------- reporting
    def reset(self) -> None:
        """Forget the counts so far (remembered item sizes stay)."""
        with self._guard:
            self._usage.clear()

    def rows(self) -> list[UsageRow]:
        """Every (caller, table, operation) seen, sorted."""
        with self._guard:
            return [UsageRow(caller, table, operation, u.requests, u.read_units, u.write_units)
                    for (caller, table, operation), u in sorted(self._usage.items())]

    def by_caller(self) -> dict[str, Usage]:
        """Totals per caller."""
        totals: dict[str, Usage] = {}
        for row in self.rows():
            totals.setdefault(row.caller, Usage()).add(row)
        return totals

    def dump(self, path: Path) -> None:
        """Write the rows as JSON (atomically), for a bench that reads several processes' meters."""
        temporary = path.with_suffix(path.suffix + ".tmp")
        temporary.write_text(json.dumps([asdict(row) for row in self.rows()]), encoding="utf-8")
        temporary.replace(path)

    def _count(self, table: str, operation: str, requests: int = 1, reads: float = 0.0,
               writes: float = 0.0) -> None:
        key = (current_caller(self.default_caller), table, operation)
        with self._guard:
            self._usage.setdefault(key, Usage()).add(Usage(requests, reads, writes))

    def _remember(self, table: str, key: str, size: int | None) -> int | None:
        """Record an item's new size (None: deleted); returns the size remembered before."""
        with self._guard:
            before = self._sizes.get((table, key))
            if size is None:
                self._sizes.pop((table, key), None)
            else:
                self._sizes[(table, key)] = size
        return before

    # ---------------------------------------------------------------- lease pricing
    def _lease_read(self, operation: str, lease: Lease | None, consistent: bool) -> None:
        size = 0 if lease is None else lease_size(lease)
        if lease is not None:
            self._remember(self.tables.leases, lease.lease_key, size)
            self._owners[lease.lease_key] = lease.lease_owner
        self._count(self.tables.leases, operation, reads=read_units(size, consistent))

    def _lease_write(self, operation: str, lease_key: str, outcome: Outcome, fence: Fence | None = None,
                     delete: bool = False, before_owner: str | None = None, owner_known: bool = False) -> Outcome:
        """Price one lease write from its outcome; fenced writes are transactions plus the backend's re-read."""
        table = self.tables.leases
        current = outcome.lease
        size = lease_size(current) if current is not None else 0
        before = self._remember(table, lease_key, None if (delete and outcome.applied) else size or None)
        billed = max(size, before or 0)
        transactional = fence is not None
        writes, reads = write_units(billed, transactional), 0.0
        if fence is not None:
            writes, reads = writes + self._fence_check_units(fence), read_units(billed, True)  # the backend's re-read
        if outcome.applied:
            old_owner = before_owner if owner_known else self._owners.get(lease_key, before_owner)
            new_owner = None if delete or current is None else current.lease_owner
            self._index_write(operation, lease_key, old_owner, new_owner, transactional)
            if delete:
                self._owners.pop(lease_key, None)
        elif current is not None:
            self._owners[lease_key] = current.lease_owner
        self._count(table, operation, reads=reads, writes=writes)
        return outcome

    def _fence_check_units(self, fence: Fence) -> float:
        """Write units of the lock item's ConditionCheck inside a fenced write's transaction."""
        lock = self._state_items.get(fence.key) or {k: v for k, v in fence.expect.items() if v is not None}
        return write_units(state_size(fence.key, lock), True)

    def _index_write(self, operation: str, lease_key: str, old_owner: str | None, new_owner: str | None,
                     transactional: bool) -> None:
        """Price the owner index's entry changes of an applied lease write and remember the new owner."""
        index = _index_writes(old_owner, new_owner)
        if index:
            self._count(INDEX_TABLE, operation, requests=0, writes=index * write_units(
                index_entry_size(lease_key, new_owner or old_owner or ""), transactional))
        self._owners[lease_key] = new_owner

    # ---------------------------------------------------------------- schema
    def ensure_tables(self) -> None:
        """Delegated, not counted (a deployment step, not a running cost)."""
        self.inner.ensure_tables()

    def close(self) -> None:
        """Write the last report (if dumping) and close the inner store."""
        self._stop_dumping.set()
        if self._dump_path is not None:
            self.dump(self._dump_path)
        self.inner.close()

    def _dump_every(self, seconds: float) -> None:
        assert self._dump_path is not None
        while not self._stop_dumping.wait(seconds):
            self.dump(self._dump_path)

    # ---------------------------------------------------------------- lease reads
    def get_lease(self, lease_key: str) -> Lease | None:
        """One GetItem (consistent as configured)."""
        lease = self.inner.get_lease(lease_key)
        self._lease_read("get_lease", lease, self.consistent_reads)
        return lease

    def scan_leases(self, page_size: int = 1000) -> LeaseScan:
        """A paginated Scan: units per page of the items read (unreadable rows priced as empty leases)."""
        scan = self.inner.scan_leases(page_size)
        sizes = []
        for lease in scan.leases:
            size = lease_size(lease)
            sizes.append(size)
            self._remember(self.tables.leases, lease.lease_key, size)
            self._owners[lease.lease_key] = lease.lease_owner
        sizes.extend(len("leaseKey") + len(bad.lease_key or "") for bad in scan.malformed)
        pages, units = paged_read_units(sizes, min(page_size, self._lease_page_items), self.consistent_reads)
        self._count(self.tables.leases, "scan", requests=pages, reads=units)
        return scan

    def list_owned_keys(self, owner: str) -> list[str]:
        """An owner-index Query (always eventually consistent), per page of KEYS_ONLY entries."""
        keys = self.inner.list_owned_keys(owner)
        pages, units = paged_read_units([index_entry_size(key, owner) for key in keys], 10**9, False)
        self._count(INDEX_TABLE, "query", requests=pages, reads=units)
        return keys

    # ---------------------------------------------------------------- lease writes
    def create_lease(self, lease: Lease) -> Outcome:
        """Conditional PutItem."""
        return self._lease_write("create", lease.lease_key, self.inner.create_lease(lease), before_owner=None,
                                 owner_known=True)

    def renew(self, lease_key: str, owner: str, expected_counter: int, throughput_kbps: float | None = None,
              during_handoff: bool = False) -> Outcome:
        """Conditional UpdateItem (owner unchanged)."""
        outcome = self.inner.renew(lease_key, owner, expected_counter, throughput_kbps, during_handoff)
        return self._lease_write("renew", lease_key, outcome, before_owner=owner, owner_known=True)

    def assign(self, lease_key: str, new_owner: str, expected_owner: str | None,
               expected_checkpoint_owner: str | None, fence: Fence | None = None, move: str | None = None) -> Outcome:
        """Conditional UpdateItem, a transaction when fenced."""
        outcome = self.inner.assign(lease_key, new_owner, expected_owner, expected_checkpoint_owner, fence, move)
        return self._lease_write("assign", lease_key, outcome, fence, before_owner=expected_owner, owner_known=True)

    def start_handoff(self, lease_key: str, new_owner: str, current_owner: str,
                      fence: Fence | None = None, move: str | None = None) -> Outcome:
        """Conditional UpdateItem, a transaction when fenced."""
        outcome = self.inner.start_handoff(lease_key, new_owner, current_owner, fence, move)
        return self._lease_write("handoff_start", lease_key, outcome, fence, before_owner=current_owner,
                                 owner_known=True)

    def complete_handoff(self, lease_key: str, checkpoint_owner: str) -> Outcome:
        """Conditional UpdateItem (owner unchanged)."""
        outcome = self.inner.complete_handoff(lease_key, checkpoint_owner)
        owner = outcome.lease.lease_owner if outcome.lease is not None else None
        return self._lease_write("handoff_complete", lease_key, outcome, before_owner=owner, owner_known=True)

    def checkpoint(self, lease_key: str, worker: str, checkpoint: Checkpoint,
                   progress: LeaseProgress | None = None, expected: Lease | None = None,
                   hand_over: bool = False) -> Outcome:
        """Conditional UpdateItem (owner unchanged)."""
        outcome = self.inner.checkpoint(lease_key, worker, checkpoint, progress, expected,
                                        hand_over)
        owner = outcome.lease.lease_owner if outcome.lease is not None else None
        return self._lease_write("checkpoint", lease_key, outcome, before_owner=owner, owner_known=True)

    def release(self, lease_key: str, owner: str) -> Outcome:
        """Conditional UpdateItem removing the owner."""
        return self._lease_write("release", lease_key, self.inner.release(lease_key, owner), before_owner=owner,
                                 owner_known=True)

    def set_pause(self, lease_key: str, reason: str | None) -> Outcome:
        """Conditional UpdateItem (owner unchanged)."""
        outcome = self.inner.set_pause(lease_key, reason)
        return self._lease_write("pause", lease_key, outcome, before_owner=_owner(outcome), owner_known=True)

    def acknowledge_pause(self, lease_key: str, worker: str) -> Outcome:
        """Conditional UpdateItem (owner unchanged)."""
        outcome = self.inner.acknowledge_pause(lease_key, worker)
        return self._lease_write("pause_ack", lease_key, outcome, before_owner=_owner(outcome), owner_known=True)

    def rewrite_checkpoint(self, lease_key: str, expected: Lease, checkpoint: Checkpoint,
                           fence: Fence | None = None) -> Outcome:
        """Conditional UpdateItem (owner unchanged), a transaction when fenced."""
        outcome = self.inner.rewrite_checkpoint(lease_key, expected, checkpoint, fence)
        return self._lease_write("rewrite", lease_key, outcome, fence, before_owner=expected.lease_owner,
                                 owner_known=True)

    def delete_lease(self, lease_key: str, expected_checkpoint: Checkpoint | None = None,
                     fence: Fence | None = None) -> Outcome:
        """Conditional DeleteItem, a transaction when fenced."""
        outcome = self.inner.delete_lease(lease_key, expected_checkpoint, fence)
        return self._lease_write("delete", lease_key, outcome, fence, delete=True)

    # ---------------------------------------------------------------- workers
    def upsert_worker(self, record: WorkerRecord) -> None:
        """UpdateItem of the worker's attributes."""
        self.inner.upsert_worker(record)
        size = worker_size(record)
        before = self._remember(self.tables.worker_metrics, record.worker_id, size)
        self._count(self.tables.worker_metrics, "heartbeat", writes=write_units(max(size, before or 0)))

    def scan_workers(self) -> WorkerScan:
        """A paginated Scan of the worker table."""
        scan = self.inner.scan_workers()
        sizes = [worker_size(record) for record in scan.workers]
        sizes.extend(len("wid") + len(bad.worker_id or "") for bad in scan.malformed)
        pages, units = paged_read_units(sizes, self._worker_page_items, self.consistent_reads)
        self._count(self.tables.worker_metrics, "scan", requests=pages, reads=units)
        return scan

    def get_worker(self, worker_id: str) -> WorkerRecord | None:
        """One consistent GetItem of the worker table."""
        record = self.inner.get_worker(worker_id)
        self._count(self.tables.worker_metrics, "get_worker",
                    reads=read_units(0 if record is None else worker_size(record), True))
        return record

    def set_drain_requested(self, worker_id: str, requested: bool) -> bool:
        """Conditional UpdateItem."""
        applied = self.inner.set_drain_requested(worker_id, requested)
        size = self._sizes.get((self.tables.worker_metrics, worker_id), 0)
        self._count(self.tables.worker_metrics, "drain_flag", writes=write_units(size))
        return applied

    def set_restart(self, worker_id: str, within_ms: int | None) -> bool:
        """Conditional UpdateItem."""
        applied = self.inner.set_restart(worker_id, within_ms)
        size = self._sizes.get((self.tables.worker_metrics, worker_id), 0)
        self._count(self.tables.worker_metrics, "restart_reservation", writes=write_units(size))
        return applied

    def delete_worker_if_unchanged(self, worker_id: str, last_update: int, heartbeat: int) -> bool:
        """Conditional DeleteItem."""
        deleted = self.inner.delete_worker_if_unchanged(worker_id, last_update, heartbeat)
        before = self._remember(self.tables.worker_metrics, worker_id, None) if deleted else \
            self._sizes.get((self.tables.worker_metrics, worker_id))
        self._count(self.tables.worker_metrics, "worker_delete", writes=write_units(before or 0))
        return deleted

    # ---------------------------------------------------------------- coordinator state
    def get_state(self, key: str, consistent: bool = True) -> dict[str, StateValue] | None:
        """GetItem (consistent unless asked otherwise)."""
        item = self.inner.get_state(key, consistent)
        self._seen_state(key, item)
        size = 0 if item is None else state_size(key, item)
        self._count(self.tables.coordinator_state, f"get {key}", reads=read_units(size, consistent))
        return item

    def _seen_state(self, key: str, item: Mapping[str, StateValue] | None) -> int | None:
        """Remember a state item as now stored (None: absent); returns its size before."""
        with self._guard:
            before = self._state_items.pop(key, None)
            if item is not None:
                self._state_items[key] = dict(item)
        return None if before is None else state_size(key, before)

    def _state_write(self, key: str, operation: str, applied: bool, after: Mapping[str, StateValue] | None) -> None:
        """Price a state write by the larger of the item before and after (a lost one by the item it found)."""
        with self._guard:
            known = self._state_items.get(key)
        before = None if known is None else state_size(key, known)
        if applied:
            self._seen_state(key, after)
            billed = max(before or 0, 0 if after is None else state_size(key, after))
        else:
            billed = before or 0
        self._count(self.tables.coordinator_state, f"{operation} {key}", writes=write_units(billed))

    def put_state(self, key: str, attributes: Mapping[str, StateValue],
                  condition: StateCondition | None = None) -> bool:
        """Conditional PutItem."""
        applied = self.inner.put_state(key, attributes, condition)
        self._state_write(key, "put", applied, attributes)
        return applied

    def update_state(self, key: str, set_attributes: Mapping[str, StateValue],
                     remove: Sequence[str] = (), condition: StateCondition | None = None) -> bool:
        """Conditional UpdateItem."""
        applied = self.inner.update_state(key, set_attributes, remove, condition)
        with self._guard:
            after = {**self._state_items.get(key, {}), **set_attributes}
        for name in remove:
            after.pop(name, None)
        self._state_write(key, "update", applied, after)
        return applied

    def delete_state(self, key: str, condition: StateCondition | None = None) -> bool:
        """Conditional DeleteItem."""
        applied = self.inner.delete_state(key, condition)
        self._state_write(key, "delete", applied, None)
        return applied


def usage_total(rows: Sequence[UsageRow], **match: Any) -> Usage:
    """The sum of the rows whose fields equal `match` (e.g. caller="leader")."""
    total = Usage()
    for row in rows:
        if all(getattr(row, name) == value for name, value in match.items()):
            total.add(row)
    return total


def _owner(outcome: Outcome) -> str | None:
    """The lease owner after a write that never changes it."""
    return outcome.lease.lease_owner if outcome.lease is not None else None
