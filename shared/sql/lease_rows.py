"""Lease <-> SQL row: every non-empty field is written; reading validates each column and names the bad attribute."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from shardherd.shared.checkpoint import Checkpoint, parse_checkpoint
from shardherd.shared.errors import InvalidCheckpoint, MalformedLease
from shardherd.shared.lease import Lease
from shardherd.shared.rounding import round_throughput
from shardherd.shared.row_checks import checked_counts, checked_throughput, decoded
from shardherd.shared.sql.schema import LEASE_ATTRIBUTES, PROGRESS_COLUMNS
from shardherd.shared.sql.values import (
    read_bytes,
    read_int,
    read_number,
    read_optional_int,
    read_optional_str,
    read_string_set,
    write_string_set,
)
from shardherd.shared.worker import LeaseProgress, lease_progress_fields

LEASE_ENTITY = "LEASE"

T = TypeVar("T")


def lease_values(lease: Lease) -> dict[str, Any]:
    """Column values of a new lease row (counter 0, entityType LEASE, empty sets as NULL)."""
    pending = lease.pending_checkpoint
    return {
        "lease_key": lease.lease_key,
        "lease_owner": lease.lease_owner,
        "lease_counter": 0,
        "checkpoint": lease.checkpoint.sequence_number,
        "checkpoint_sub_sequence_number": lease.checkpoint.sub_sequence_number,
        "owner_switches_since_checkpoint": lease.owner_switches_since_checkpoint,
        "pending_checkpoint": pending.sequence_number if pending else None,
        "pending_checkpoint_sub_sequence_number": pending.sub_sequence_number if pending else None,
        "pending_checkpoint_state": lease.pending_checkpoint_state,
        "parent_shard_id": write_string_set(lease.parent_shard_ids),
        "child_shard_ids": write_string_set(lease.child_shard_ids),
        "starting_hash_key": lease.starting_hash_key,
        "ending_hash_key": lease.ending_hash_key,
        "throughput_kbps": None if lease.throughput_kbps is None else round_throughput(lease.throughput_kbps),
        "checkpoint_owner": lease.checkpoint_owner,
        "entity_type": LEASE_ENTITY,
        "stream_name": lease.stream_name,
        "shard_id": lease.shard_id,
        "millis_behind_latest": lease.millis_behind_latest,
        "records_processed": lease.records_processed,
        "bytes_processed": lease.bytes_processed,
        "records_behind": lease.records_behind,
        "checkpointed_at_millis": lease.checkpointed_at_millis,
        "last_move": lease.last_move,
        "paused": lease.paused,
        "paused_by": lease.paused_by,
    }


def checkpoint_values(checkpoint: Checkpoint, progress: LeaseProgress | None = None) -> dict[str, Any]:
    """Column values a checkpoint write sets: KCL's pending-checkpoint columns are cleared, as KCL's checkpoint does.

    The owner's progress columns are set too when `progress` is given.
    """
    values: dict[str, Any] = {
        "checkpoint": checkpoint.sequence_number,
        "checkpoint_sub_sequence_number": checkpoint.sub_sequence_number,
        "owner_switches_since_checkpoint": 0,
        "pending_checkpoint": None,
        "pending_checkpoint_sub_sequence_number": None,
        "pending_checkpoint_state": None,
    }
    if progress is not None:
        values.update(lease_progress_fields(progress))
    return values


def decode_lease(row: Mapping[Any, Any], table: str = "lease") -> Lease:
    """The lease a row holds; MalformedLease (with the key and the offending attribute) if any column is unreadable.

    A throughput no consumer can use (negative, implausible) is dropped and noted in `repairs`; both cases are
    reported (shared/row_checks.py).
    """
    return decoded(table, lambda: _decode_lease(row), lambda lease: lease.lease_key)


def _decode_lease(row: Mapping[Any, Any]) -> Lease:
    key = row["lease_key"]
    if not isinstance(key, str) or not key:
        raise MalformedLease(None, f"leaseKey is missing or not a string: {key!r}")

    def column(name: str, reader: Callable[[object], T]) -> T:
        try:
            return reader(row[name])
        except ValueError as exc:
            raise MalformedLease(key, f"{LEASE_ATTRIBUTES[name]}: {exc}") from exc

    try:
        checkpoint = parse_checkpoint(row["checkpoint"], row["checkpoint_sub_sequence_number"])
        pending = None
        if row["pending_checkpoint"] is not None:
            pending = parse_checkpoint(row["pending_checkpoint"], row["pending_checkpoint_sub_sequence_number"])
    except InvalidCheckpoint as exc:
        raise MalformedLease(key, str(exc)) from exc
    throughput, repairs = checked_throughput(column("throughput_kbps", read_number),
                                             LEASE_ATTRIBUTES["throughput_kbps"])
    progress, progress_repairs = checked_counts({LEASE_ATTRIBUTES[name]: column(name, read_optional_int)
                                                 for name in PROGRESS_COLUMNS})
    return Lease(
        lease_key=key,
        lease_owner=column("lease_owner", read_optional_str),
        lease_counter=column("lease_counter", read_int),
        checkpoint=checkpoint,
        owner_switches_since_checkpoint=column("owner_switches_since_checkpoint", lambda v: read_int(v, 0)),
        pending_checkpoint=pending,
        pending_checkpoint_state=column("pending_checkpoint_state", read_bytes),
        parent_shard_ids=column("parent_shard_id", read_string_set),
        child_shard_ids=column("child_shard_ids", read_string_set),
        starting_hash_key=column("starting_hash_key", read_optional_str),
        ending_hash_key=column("ending_hash_key", read_optional_str),
        throughput_kbps=throughput,
        checkpoint_owner=column("checkpoint_owner", read_optional_str),
        stream_name=column("stream_name", read_optional_str),
        shard_id=column("shard_id", read_optional_str),
        millis_behind_latest=progress[LEASE_ATTRIBUTES["millis_behind_latest"]],
        records_processed=progress[LEASE_ATTRIBUTES["records_processed"]],
        bytes_processed=progress[LEASE_ATTRIBUTES["bytes_processed"]],
        records_behind=progress[LEASE_ATTRIBUTES["records_behind"]],
        checkpointed_at_millis=progress[LEASE_ATTRIBUTES["checkpointed_at_millis"]],
        last_move=column("last_move", read_optional_str),
        paused=column("paused", read_optional_str),
        paused_by=column("paused_by", read_optional_str),
        repairs=repairs + progress_repairs,
    )
