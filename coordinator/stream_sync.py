"""Shard sync and lease scope for single- and multi-stream applications (pure: the leader loop does the I/O).

A multi-stream application (KCL 3.x) keys leases `account:stream:creationEpoch:shardId`. Each stream is planned on
its own by the single-stream planner (coordinator/shard_sync.py): its leases are presented under their shard ids,
so children, parents and hash ranges are judged within the stream, and the plan is mapped back to multi-stream keys
with the `streamName` / `shardId` attributes KCL writes. Leases of streams the application does not read (another
application's, a recreated stream's older incarnation) and rows whose key does not parse are *out of scope*: shard
sync leaves them alone and the leader never assigns them; they stay in the table untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from shardherd.coordinator.shard_sync import LeaseCreation, LeaseDeletion, SyncPlan, plan_shard_sync
from shardherd.shared.lease import Lease
from shardherd.shared.shards import Shard
from shardherd.shared.streams import MalformedLeaseKey, StreamIdentifier, lease_address

# Shards listed per stream; the key None is the single stream of a single-stream application.
Listings = Mapping[StreamIdentifier | None, Sequence[Shard]]
PositionOf = Callable[[StreamIdentifier | None], tuple[str, datetime | None]]


@dataclass(frozen=True, slots=True)
class StreamListings:
    """What a multi-stream shard source found: the streams it identified, their shards, and per-stream failures.

    `streams` includes identified streams whose listing failed: their leases stay in scope (agents keep them)
    while their shard sync waits for the next pass.
    """

    streams: frozenset[StreamIdentifier]
    shards: Listings
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StreamsPlan:
    """One pass over every listed stream: the combined plan, and the streams whose planning failed (with why)."""

    plan: SyncPlan
    errors: dict[str, str] = field(default_factory=dict)


def scope_problem(lease: Lease, streams: Collection[StreamIdentifier] | None) -> str | None:
    """Why the application does not process `lease` (None if it does).

    `streams` is None for a single-stream application (only shard-id keys are its own), else the identifiers of
    the streams it reads.
    """
    try:
        address = lease_address(lease)
    except MalformedLeaseKey as exc:
        return exc.reason
    if streams is None:
        if address.stream is not None:
            return f"a multi-stream lease (stream {address.stream.serialized}) in a single-stream application"
        return None
    if address.stream is None:
        return "a single-stream lease in a multi-stream application"
    if address.stream not in streams:
        return f"stream {address.stream.serialized} is not one of the application's streams"
    return None


def stream_of(lease: Lease) -> StreamIdentifier | None:
    """The stream a lease belongs to (None for single-stream and malformed keys)."""
    try:
        return lease_address(lease).stream
    except MalformedLeaseKey:
        return None


def plan_streams_sync(listings: Listings, leases: Iterable[Lease], position_of: PositionOf) -> StreamsPlan:
    """Plan shard sync for every listed stream; a stream whose listing the planner rejects is reported, not synced."""
    grouped: dict[StreamIdentifier | None, dict[str, Lease]] = {stream: {} for stream in listings}
    for lease in leases:
        try:
            address = lease_address(lease)
        except MalformedLeaseKey:
            continue
        if address.stream in grouped:
            grouped[address.stream][address.shard_id] = lease
    creates: list[LeaseCreation] = []
    deletes: list[LeaseDeletion] = []
    inconsistent: list[str] = []
    errors: dict[str, str] = {}
    for stream, shards in listings.items():
        local = grouped[stream]
        position, timestamp = position_of(stream)
        try:
            plan = plan_shard_sync(shards, [_as_local(lease, shard) for shard, lease in local.items()], position,
                                   timestamp)
        except ValueError as exc:
            errors[_label(stream)] = f"{type(exc).__name__}: {exc}"
            continue
        creates.extend(LeaseCreation(_as_stream(creation.lease, stream), creation.reason) for creation in plan.creates)
        deletes.extend(LeaseDeletion(local[deletion.lease.lease_key], deletion.reason) for deletion in plan.deletes)
        inconsistent.extend(_key(stream, shard_id) for shard_id in plan.inconsistent_shard_ids)
    return StreamsPlan(SyncPlan(tuple(creates), tuple(deletes), tuple(inconsistent)), errors)


def children_waiting(listings: Listings, leases: Collection[Lease]) -> bool:
    """True when a finished lease has no child with a lease (none listed yet, or listed but leaseless): sync now."""
    present = {lease.lease_key for lease in leases}
    for stream, shards in listings.items():
        children: dict[str, list[str]] = {}
        for shard in shards:
            for parent in shard.parent_ids:
                children.setdefault(parent, []).append(shard.shard_id)
        for lease in leases:
            if not lease.is_finished or stream_of(lease) != stream:
                continue
            kids = children.get(lease.shard, [])
            if not any(_key(stream, child) in present for child in kids):
                return True
    return False


def _label(stream: StreamIdentifier | None) -> str:
    return "stream" if stream is None else stream.serialized


def _key(stream: StreamIdentifier | None, shard_id: str) -> str:
    return shard_id if stream is None else stream.lease_key(shard_id)


def _as_local(lease: Lease, shard_id: str) -> Lease:
    """The lease as the single-stream planner sees it: keyed by its shard id."""
    if lease.lease_key == shard_id and lease.stream_name is None and lease.shard_id is None:
        return lease
    return lease.with_changes(lease_key=shard_id, stream_name=None, shard_id=None)


def _as_stream(lease: Lease, stream: StreamIdentifier | None) -> Lease:
    """A lease the planner created, under the stream's key and with KCL's multi-stream attributes."""
    if stream is None:
        return lease
    return lease.with_changes(lease_key=stream.lease_key(lease.lease_key), stream_name=stream.serialized,
                              shard_id=lease.lease_key)
