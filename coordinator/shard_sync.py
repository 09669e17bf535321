"""Shard sync planner: which leases to create and delete for one stream, from its shards and its lease table.

Pure (no I/O), so the leader loop, the fleet simulator and the tests drive the same code. The semantics are KCL 3.x's
hierarchical shard sync (HierarchicalShardSyncer), with one difference: in KCL the worker that finishes a parent creates
the child leases in its shutdown task, while in shardherd the leader's shard sync creates them, from the parent leases'
SHARD_END checkpoints. A pass makes four decisions:

1. Children of finished parents (`PARENTS_FINISHED`). A shard without a lease gets one when at least one of its
   parents has a lease and every parent is done: its lease is at SHARD_END, or the parent shard is gone from the
   stream (its lease, if any, is garbage). A parent still in the stream without a lease is not done: it waits for its
   own lease (one generation at a time); it cannot have been cleaned up, since a finished lease is deleted only after
   all its children have started leases. Children start at TRIM_HORIZON, or at AT_TIMESTAMP when that is the initial
   position (so records older than the timestamp in a child of an early-closed root are skipped too; KCL always uses
   TRIM_HORIZON here). Only children of leases that already exist are created, so a pass creates one generation.
2. Untracked ancestry (`NEW_OPEN_SHARD`, `TREE_ROOT`, `UNLEASED_COPARENT`), KCL's non-empty-table walk. Leases created
   in step 1 count as existing. A shard is a *descendant* when it has a lease, or when one of its parents (among the
   shards still in the stream) is a descendant or is *marked*; with TRIM_HORIZON or AT_TIMESTAMP every leaseless shard
   that is not a descendant is marked (such a shard is always a root of the tree: none of its parents is still in the
   stream). For every open, leaseless shard that is not an inconsistent child (an open child of a parent the listing
   still shows open: skipped this pass and reported), the walk goes up through leaseless descendants; a leaseless
   parent met on the way that is not a descendant gets a lease at the initial position (a marked root under
   TRIM_HORIZON / AT_TIMESTAMP, or, under LATEST, e.g. the co-parent of a merge whose other parent is leased). An open
   shard that is not a descendant gets a lease at the initial position itself. Descendants get no lease from the walk:
   step 1 gives them one when their parents finish. On an empty table this yields one lease per open shard under
   LATEST and one lease per root (the shards whose ancestors have left the stream) under TRIM_HORIZON / AT_TIMESTAMP,
   which is what KCL's empty-table ListShards with ShardFilter AT_LATEST / AT_TRIM_HORIZON returns; the planner
   computes it from the full list because emulators ignore ShardFilter. The example in KCL's comments, leases (4,5,7):
   LATEST creates (6), TRIM_HORIZON and AT_TIMESTAMP create (0,1).
3. Garbage (`SHARD_GONE`): a lease whose shard is no longer in the stream is deleted, whatever its checkpoint. A lease
   whose shard is in the stream is never deleted unless it is at SHARD_END.
4. Finished leases (`CHILDREN_STARTED`): a SHARD_END lease is deleted once it has at least one known child, every child
   (from the listing and from the lease's `childShardIds`) has a lease whose checkpoint is not TRIM_HORIZON or
   AT_TIMESTAMP (processing started), and none of its own parents has a lease any more. Deleting top-down keeps the
   invariant step 1 relies on.

The open shards the walk relies on must tile the hash key space 0..2^128-1 (KCL retries ListShards until they do); a
listing that does not is rejected with ShardListError rather than turned into leases.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from shardherd.shared.checkpoint import AT_TIMESTAMP, INITIAL_SENTINELS, TRIM_HORIZON, Checkpoint, Sentinel
from shardherd.shared.errors import ShardherdError
from shardherd.shared.lease import Lease, new_lease
from shardherd.shared.shards import MAX_HASH_KEY, Shard, ShardListError

# Initial positions that read a shard from its start (TRIM_HORIZON, or from the timestamp on); a lease still holding
# one of them has not started processing.
_FROM_THE_START = frozenset({Sentinel.TRIM_HORIZON, Sentinel.AT_TIMESTAMP})


class ShardSyncInputError(ShardherdError, ValueError):
    """Leases or the initial position given to the planner are out of its scope or inconsistent."""


class CreateReason(enum.Enum):
    """Why shard sync creates a lease."""

    PARENTS_FINISHED = "parents_finished"  # every parent reached SHARD_END (or left the stream)
    NEW_OPEN_SHARD = "new_open_shard"  # open shard with no tracked ancestry: starts at the initial position
    TREE_ROOT = "tree_root"  # oldest shard still in the stream above an untracked open shard
    UNLEASED_COPARENT = "unleased_coparent"  # untracked parent (e.g. merge co-parent) of a tracked shard's descendant


class DeleteReason(enum.Enum):
    """Why shard sync deletes a lease."""

    SHARD_GONE = "shard_gone"  # the shard is no longer in the stream (garbage)
    CHILDREN_STARTED = "children_started"  # finished, children started, own parents' leases gone


@dataclass(frozen=True, slots=True)
class LeaseCreation:
    """A lease to create (conditional put: only if absent) and why."""

    lease: Lease
    reason: CreateReason


@dataclass(frozen=True, slots=True)
class LeaseDeletion:
    """A lease to delete (the snapshot it was judged on) and why."""

    lease: Lease
    reason: DeleteReason


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """The outcome of one shard sync pass: creations in starting-sequence-number order, deletions by lease key.

    `inconsistent_shard_ids` are open shards listed with a parent that the listing still shows open; the walk skipped
    them this pass (they are reported, not dropped).
    """

    creates: tuple[LeaseCreation, ...]
    deletes: tuple[LeaseDeletion, ...]
    inconsistent_shard_ids: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        """True when the pass changes nothing."""
        return not self.creates and not self.deletes


@dataclass(frozen=True, slots=True)
class _Stream:
    """The shards of one stream indexed for lineage walks."""

    shards: dict[str, Shard]
    order: tuple[str, ...]  # parents before children, ties by starting sequence number
    children: dict[str, tuple[str, ...]]
    listed_parents: dict[str, tuple[str, ...]]  # each shard's parents that are still listed
    inconsistent: frozenset[str]  # open shards whose listed parent is also open

    def parents_in_stream(self, shard_id: str) -> tuple[str, ...]:
        """The shard's parents that are still listed."""
        return self.listed_parents[shard_id]


def plan_shard_sync(
    shards: Iterable[Shard],
    leases: Iterable[Lease],
    initial_position: Sentinel | str,
    initial_timestamp: datetime | None = None,
) -> SyncPlan:
    """Plan one shard sync pass for one stream (see the module docstring for the rules).

    `initial_position` is TRIM_HORIZON, LATEST or AT_TIMESTAMP (a Sentinel or its name). The timestamp itself is not
    stored in leases (KCL keeps it in the configuration), so it is only checked to be present, timezone-aware, with
    AT_TIMESTAMP.
    """
    position = _initial_position(initial_position, initial_timestamp)
    stream = _index_stream(shards)
    table = _index_leases(leases)
    child_start = AT_TIMESTAMP if position is Sentinel.AT_TIMESTAMP else TRIM_HORIZON
    created = _children_of_finished(stream, table, child_start)
    tracked = set(table) | set(created)
    created.update(_untracked_ancestry(stream, tracked, Checkpoint.of(position)))
    creates = sorted(created.values(), key=lambda c: stream.shards[c.lease.lease_key].start_order)
    deletes = [d for d in (_deletion(stream, table, lease) for lease in table.values()) if d is not None]
    return SyncPlan(
        creates=tuple(creates),
        deletes=tuple(sorted(deletes, key=lambda d: d.lease.lease_key)),
        inconsistent_shard_ids=tuple(shard_id for shard_id in stream.order if shard_id in stream.inconsistent),
    )


def _initial_position(position: Sentinel | str, timestamp: datetime | None) -> Sentinel:
    name = position.value if isinstance(position, Sentinel) else position
    sentinel = Sentinel.__members__.get(name) if isinstance(name, str) else None
    if sentinel is None or sentinel not in INITIAL_SENTINELS:
        raise ShardSyncInputError(f"initial position must be TRIM_HORIZON, LATEST or AT_TIMESTAMP, got {position!r}")
    if sentinel is Sentinel.AT_TIMESTAMP:
        if timestamp is None:
            raise ShardSyncInputError("initial position AT_TIMESTAMP needs an initial timestamp")
        if timestamp.tzinfo is None:
            raise ShardSyncInputError(f"initial timestamp {timestamp.isoformat()} must be timezone-aware")
    return sentinel


def _index_stream(shards: Iterable[Shard]) -> _Stream:
    by_id: dict[str, Shard] = {}
    for shard in shards:
        if not isinstance(shard, Shard):
            raise ShardListError(f"expected Shard objects, got {type(shard).__name__}")
        if shard.shard_id in by_id:
            raise ShardListError(f"shard {shard.shard_id} is listed twice")
        by_id[shard.shard_id] = shard
    children: dict[str, list[str]] = {}
    for shard in by_id.values():
        for parent in shard.parent_ids:
            children.setdefault(parent, []).append(shard.shard_id)
    listed_parents = {sid: tuple(p for p in shard.parent_ids if p in by_id) for sid, shard in by_id.items()}
    stream = _Stream(
        shards=by_id,
        order=_parents_first(by_id, children),
        children={parent: tuple(kids) for parent, kids in children.items()},
        listed_parents=listed_parents,
        inconsistent=frozenset(
            sid
            for sid, shard in by_id.items()
            if shard.is_open and any(by_id[p].is_open for p in listed_parents[sid])
        ),
    )
    _check_open_shards_tile_hash_space(stream)
    return stream


def _parents_first(by_id: dict[str, Shard], children: dict[str, list[str]]) -> tuple[str, ...]:
    """Topological order of the listed shards (Kahn), ties broken by starting sequence number; rejects cycles."""
    waiting = {sid: sum(p in by_id for p in shard.parent_ids) for sid, shard in by_id.items()}
    ready = [by_id[sid].start_order for sid, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, shard_id = heapq.heappop(ready)
        order.append(shard_id)
        for child in children.get(shard_id, ()):
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, by_id[child].start_order)
    if len(order) != len(by_id):
        cyclic = sorted(set(by_id) - set(order))
        raise ShardListError(f"shard lineage has a cycle through {', '.join(cyclic[:10])}")
    return tuple(order)


def _check_open_shards_tile_hash_space(stream: _Stream) -> None:
    ranges = sorted(
        (shard.hash_range, shard.shard_id)
        for shard in stream.shards.values()
        if shard.is_open and shard.shard_id not in stream.inconsistent
    )
    if not ranges:
        raise ShardListError("the listing has no open shard; a Kinesis stream always has at least one")
    expected_start = 0
    for (low, high), shard_id in ranges:
        if low != expected_start:
            problem = "a hole" if low > expected_start else "an overlap"
            raise ShardListError(f"open shards leave {problem} in the hash key space at {expected_start} ({shard_id})")
        expected_start = high + 1
    if expected_start != MAX_HASH_KEY + 1:
        raise ShardListError(f"open shards stop at hash key {expected_start - 1}, short of 2^128-1")


def _index_leases(leases: Iterable[Lease]) -> dict[str, Lease]:
    table: dict[str, Lease] = {}
    for lease in leases:
        if not isinstance(lease, Lease):
            raise ShardSyncInputError(f"expected Lease objects, got {type(lease).__name__}")
        if lease.stream_name is not None or lease.shard_id is not None or ":" in lease.lease_key:
            raise ShardSyncInputError(
                f"lease {lease.lease_key!r} is a multi-stream lease; the planner handles one stream's leases only"
            )
        if lease.lease_key in table:
            raise ShardSyncInputError(f"lease {lease.lease_key!r} is given twice")
        table[lease.lease_key] = lease
    return table


def _lease_for(shard: Shard, checkpoint: Checkpoint) -> Lease:
    return new_lease(
        shard.shard_id,
        checkpoint,
        parents=frozenset(shard.parent_ids),
        hash_range=(shard.starting_hash_key, shard.ending_hash_key),
    )


def _children_of_finished(stream: _Stream, table: dict[str, Lease], start: Checkpoint) -> dict[str, LeaseCreation]:
    """Step 1: leases for leaseless shards whose parents are all done and at least one of them is leased."""

    def done(parent: str) -> bool:
        lease = table.get(parent)
        gone = parent not in stream.shards
        return gone if lease is None else lease.is_finished or gone

    created: dict[str, LeaseCreation] = {}
    for shard_id in stream.order:
        shard = stream.shards[shard_id]
        parents = shard.parent_ids
        if shard_id in table or not any(p in table for p in parents):
            continue
        if all(done(p) for p in parents):
            created[shard_id] = LeaseCreation(_lease_for(shard, start), CreateReason.PARENTS_FINISHED)
    return created


def _untracked_ancestry(stream: _Stream, tracked: set[str], position: Checkpoint) -> dict[str, LeaseCreation]:
    """Step 2: KCL's walk from leaseless open shards up through leaseless descendants."""
    descendants = _descendants(stream, tracked, position.sentinel in _FROM_THE_START)
    created: dict[str, LeaseCreation] = {}
    to_visit: list[str] = []
    for shard_id in stream.order:
        shard = stream.shards[shard_id]
        if shard_id in tracked or not shard.is_open or shard_id in stream.inconsistent:
            continue
        if shard_id in descendants:
            to_visit.append(shard_id)
        else:
            created[shard_id] = LeaseCreation(_lease_for(shard, position), CreateReason.NEW_OPEN_SHARD)
    visited = set(to_visit)
    while to_visit:
        for parent in stream.parents_in_stream(to_visit.pop()):
            if parent in tracked or parent in created:
                continue
            if parent in descendants:
                if parent not in visited:
                    visited.add(parent)
                    to_visit.append(parent)
                continue
            reason = CreateReason.UNLEASED_COPARENT if stream.parents_in_stream(parent) else CreateReason.TREE_ROOT
            created[parent] = LeaseCreation(_lease_for(stream.shards[parent], position), reason)
    return created


def _descendants(stream: _Stream, tracked: set[str], marked_roots: bool) -> set[str]:
    """The shards step 2's walk climbs: tracked ones and their descendants, judged in creation order.

    Reading from the start, KCL also marks every shard that is neither, so its children count as descendants too.
    """
    descendants: set[str] = set()
    marked: set[str] = set()
    for shard_id in stream.order:
        if shard_id in tracked or any(p in descendants or p in marked for p in stream.parents_in_stream(shard_id)):
            descendants.add(shard_id)
        elif marked_roots:
            marked.add(shard_id)
    return descendants


def _deletion(stream: _Stream, table: dict[str, Lease], lease: Lease) -> LeaseDeletion | None:
    """Steps 3 and 4 for one lease."""
    shard = stream.shards.get(lease.lease_key)
    if shard is None:
        return LeaseDeletion(lease, DeleteReason.SHARD_GONE)
    if not lease.is_finished:
        return None
    children = set(stream.children.get(shard.shard_id, ())) | lease.child_shard_ids
    if not children or not all(_started(table.get(child)) for child in children):
        return None
    if any(parent in table for parent in set(shard.parent_ids) | lease.parent_shard_ids):
        return None
    return LeaseDeletion(lease, DeleteReason.CHILDREN_STARTED)


def _started(lease: Lease | None) -> bool:
    return lease is not None and lease.checkpoint.sentinel not in _FROM_THE_START

