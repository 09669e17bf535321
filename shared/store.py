"""The store interface every backend (DynamoDB, SQL) implements with identical, atomic, conditional semantics.

Every write is a single conditional operation. A lost race is a normal outcome (`Outcome.applied == False` with the
current row and a `Conflict` saying why), never an exception and never a silent overwrite. Transient failures are
retried with jittered backoff inside the backend and surface as `StoreUnavailable` once the budget is spent.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.errors import MalformedLease, MalformedWorker
from shardherd.shared.lease import Lease
from shardherd.shared.worker import LeaseProgress, WorkerRecord

# Values a coordinator-state item may hold (the lock client's strings, epochs as integers, opaque bytes).
StateValue = str | int | bytes

# Attribute -> required value; None means "the attribute must be absent". The hash key (`key`) may be named too:
# {"key": None} means "the item must not exist".
StateCondition = Mapping[str, StateValue | None]

STATE_KEY_ATTRIBUTE = "key"


class Conflict(enum.Enum):
    """Why a conditional write was not applied."""

    NONE = "none"
    NOT_FOUND = "not_found"  # the lease (or item) does not exist
    ALREADY_EXISTS = "already_exists"  # create found a row with that key
    OWNERSHIP = "ownership"  # owner / checkpoint owner / counter did not match what the caller expected
    STALE_CHECKPOINT = "stale_checkpoint"  # the checkpoint would move backwards or past SHARD_END
    FENCED = "fenced"  # the fencing condition on the coordinator state (the leader lock) failed


@dataclass(frozen=True, slots=True)
class Outcome:
    """The result of one conditional lease write: the row after the write if applied, else the current row."""

    applied: bool
    lease: Lease | None
    conflict: Conflict = Conflict.NONE

    @classmethod
    def ok(cls, lease: Lease) -> Outcome:
        """An applied write."""
        return cls(True, lease, Conflict.NONE)

    @classmethod
    def lost(cls, conflict: Conflict, current: Lease | None) -> Outcome:
        """A write that lost its race (or found nothing), with the row as it is now."""
        return cls(False, current, conflict)


@dataclass(frozen=True, slots=True)
class Fence:
    """A condition on a coordinator-state item that must hold atomically with a lease write.

    The leader passes its lock item (owner and epoch), so a leader whose lock was taken can never write afterwards.
    """

    key: str
    expect: StateCondition


@dataclass(frozen=True, slots=True)
class LeaseScan:
    """All readable leases of the table plus the rows that could not be read (reported, never deleted)."""

    leases: list[Lease]
    malformed: list[MalformedLease] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class WorkerScan:
    """All readable worker records plus the ones that could not be read."""

    workers: list[WorkerRecord]
    malformed: list[MalformedWorker] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TableNames:
    """The three tables of one application, named as KCL 3.x names them."""

    leases: str
    worker_metrics: str
    coordinator_state: str

    @classmethod
    def for_application(cls, application: str) -> TableNames:
        """KCL's names: `<app>`, `<app>-WorkerMetricStats`, `<app>-CoordinatorState`."""
        return cls(application, f"{application}-WorkerMetricStats", f"{application}-CoordinatorState")


LEASE_OWNER_INDEX = "LeaseOwnerToLeaseKeyIndex"


class LeaseStore(ABC):
    """Leases, worker records and coordinator state of one application, in one backend."""

    tables: TableNames

    # ---------------------------------------------------------------- schema
    @abstractmethod
    def ensure_tables(self) -> None:
        """Create missing tables (and the leaseOwner index on an existing KCL 2.x table), waiting until usable."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""

    # ---------------------------------------------------------------- lease reads
    @abstractmethod
    def get_lease(self, lease_key: str) -> Lease | None:
        """Read one lease (strongly consistent); None if absent; MalformedLease if the row cannot be read."""

    @abstractmethod
    def scan_leases(self, page_size: int = 1000) -> LeaseScan:
        """Read every lease with a paginated scan; unreadable rows go to `malformed` and are left untouched."""

    @abstractmethod
    def list_owned_keys(self, owner: str) -> list[str]:
        """Keys of the leases whose `leaseOwner` is `owner`, via the owner index (eventually consistent on AWS)."""

    # ---------------------------------------------------------------- lease writes
    @abstractmethod
    def create_lease(self, lease: Lease) -> Outcome:
        """Insert a lease if no lease with that key exists; counter starts at 0.

        Otherwise ALREADY_EXISTS with the current row, or None if it is unreadable (an unreadable row is never
        overwritten).
        """

    @abstractmethod
    def renew(self, lease_key: str, owner: str, expected_counter: int, throughput_kbps: float | None = None,
              during_handoff: bool = False) -> Outcome:
        """Owner renewal: counter+1 if owner and counter match (and, unless `during_handoff`, no checkpointOwner).

        With `during_handoff` the renewer is the draining checkpoint owner: requires `checkpointOwner == owner`.
        """

    @abstractmethod
    def assign(self, lease_key: str, new_owner: str, expected_owner: str | None,
               expected_checkpoint_owner: str | None, fence: Fence | None = None, move: str | None = None) -> Outcome:
        """Leader assignment (KCL assignLease): conditioned on both owner fields, not on the counter.

        Sets `leaseOwner`, removes `checkpointOwner`, counter+1, and ownerSwitches+1 when the owner really changes.
        `move` (the leader's record of this move) becomes `lastMove` in the same write; without one it is removed.
        """

    @abstractmethod
    def start_handoff(self, lease_key: str, new_owner: str, current_owner: str,
                      fence: Fence | None = None, move: str | None = None) -> Outcome:
        """Graceful handoff step 1: `leaseOwner := new_owner`, `checkpointOwner := current_owner`; counter untouched.

        `move` becomes `lastMove` in the same write, as with `assign`.
        """

    @abstractmethod
    def complete_handoff(self, lease_key: str, checkpoint_owner: str) -> Outcome:
        """Graceful handoff step 2, by the old owner after its final checkpoint: clears `checkpointOwner`, counter+1."""

    @abstractmethod
    def checkpoint(self, lease_key: str, worker: str, checkpoint: Checkpoint,
                   progress: LeaseProgress | None = None, expected: Lease | None = None,
                   hand_over: bool = False) -> Outcome:
        """Record progress; monotonic (STALE_CHECKPOINT if it would go backwards or past SHARD_END).

        Allowed for the lease owner when no handoff is running, or for the checkpoint owner during one. Resets
        `ownerSwitchesSinceCheckpoint`, counter+1, and removes a KCL worker's two-phase `pendingCheckpoint*` fields, as
        KCL's own checkpoint does (the new checkpoint supersedes a prepared one; every other write keeps them).
        `progress` (lag, records, bytes; failures and refusals are the worker row's) is stored on the lease in the
        same write when given.
        `expected` is the row as the caller last saw it (its own last write): a store that reads the row before its
        conditional write may start from it instead, saving that read; a stale one costs a refused write and a retry
        from the row it returns, never a wrong checkpoint.
        `hand_over`: when `worker` is the checkpoint owner of a running handoff, the same write completes it, as
        `complete_handoff` right after would (`checkpointOwner` removed, ownerSwitches 1): the final checkpoint and
        the release in one request, so the next owner never finds the lease released short of that checkpoint.
        Without a handoff running it is a plain checkpoint (the returned row's `checkpoint_owner` tells which).
        """

    @abstractmethod
    def release(self, lease_key: str, owner: str) -> Outcome:
        """The owner gives the lease up: `leaseOwner` removed, counter+1 (used by self-fencing and drain)."""

    @abstractmethod
    def delete_lease(self, lease_key: str, expected_checkpoint: Checkpoint | None = None,
                     fence: Fence | None = None) -> Outcome:
        """Delete a lease; if `expected_checkpoint` is given, only while the checkpoint still equals it."""

    # ---------------------------------------------------------------- operator controls (shared/pause.py)
    @abstractmethod
    def set_pause(self, lease_key: str, reason: str | None) -> Outcome:
        """Pause a lease (`reason`) or resume it (None: the pause and its acknowledgement are removed).

        Owners and counter are untouched, so a renewing owner (KCL's or ours) is never disturbed; pausing a paused
        lease only replaces its reason. NOT_FOUND if there is no such lease.
        """

    @abstractmethod
    def acknowledge_pause(self, lease_key: str, worker: str) -> Outcome:
        """`worker` stopped processing the paused lease: `paused_by := worker`.

        Applied only while the lease is paused and `worker` is its actual owner (OWNERSHIP otherwise).
        """

    @abstractmethod
    def rewrite_checkpoint(self, lease_key: str, expected: Lease, checkpoint: Checkpoint,
                           fence: Fence | None = None) -> Outcome:
        """Move a paused lease's checkpoint anywhere, backwards included (a rewind), counter+1.

        Conditioned on the row still being `expected` in owners, checkpoint, pause and acknowledgement, and on the
        lease being paused (OWNERSHIP otherwise): nobody processes it, so nothing can checkpoint over the rewrite.
        KCL's pending-checkpoint fields are removed, as a checkpoint removes them.
        """

    # ---------------------------------------------------------------- workers
    @abstractmethod
    def upsert_worker(self, record: WorkerRecord) -> None:
        """Write the worker's own attributes (everything but `drainRequested`), creating the row if needed."""

    @abstractmethod
    def scan_workers(self) -> WorkerScan:
        """Read every worker record."""

    @abstractmethod
    def get_worker(self, worker_id: str) -> WorkerRecord | None:
        """Read one worker record (strongly consistent); None if absent; MalformedWorker if it cannot be read.

        A worker reads its own row this way (its stop reads the operator's flags in it): one item, not the table.
        """

    @abstractmethod
    def set_drain_requested(self, worker_id: str, requested: bool) -> bool:
        """Operator drain flag; False if the worker has no record."""

    @abstractmethod
    def set_restart(self, worker_id: str, within_ms: int | None) -> bool:
        """Set (or with None clear) the worker's restart reservation (shared/restart.py); False if it has no record.

        Like the drain flag, heartbeats never write it: the stopping worker or an operator sets it, the worker back
        from its restart clears it.
        """

    @abstractmethod
    def delete_worker_if_unchanged(self, worker_id: str, last_update: int, heartbeat: int) -> bool:
        """Delete a stale worker record only if it still has the `lut` and `hb` that were read (KCL's cleanup rule)."""

    # ---------------------------------------------------------------- coordinator state
    @abstractmethod
    def get_state(self, key: str, consistent: bool = True) -> dict[str, StateValue] | None:
        """Read a coordinator-state item without its hash key; None if absent.

        Strongly consistent unless `consistent` is False (half the read cost on DynamoDB; a poll that only needs to
        notice a change soon, like the assignment version, asks for that).
        """

    @abstractmethod
    def put_state(self, key: str, attributes: Mapping[str, StateValue],
                  condition: StateCondition | None = None) -> bool:
        """Replace the whole item if `condition` holds; False otherwise."""

    @abstractmethod
    def update_state(self, key: str, set_attributes: Mapping[str, StateValue],
                     remove: Sequence[str] = (), condition: StateCondition | None = None) -> bool:
        """Set and remove some attributes of an existing item if `condition` holds; False otherwise."""

    @abstractmethod
    def delete_state(self, key: str, condition: StateCondition | None = None) -> bool:
        """Delete an item if it exists and `condition` holds; False otherwise."""
