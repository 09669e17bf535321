"""Lease <-> DynamoDB item in KCL 3.x's exact attribute names and types (KCL's `DynamoDBLeaseSerializer`)."""

from __future__ import annotations

from typing import Any

from shardherd.shared.checkpoint import Checkpoint, parse_checkpoint
from shardherd.shared.dynamo.attributes import (
    AttributeTypeError,
    integer,
    read_bytes,
    read_float,
    read_int,
    read_number_text,
    read_string,
    read_string_set,
    rounded_micro,
    string,
    string_set,
)
from shardherd.shared.dynamo.expressions import AttributeValue, Expression, Item
from shardherd.shared.errors import InvalidCheckpoint, MalformedLease
from shardherd.shared.lease import Lease
from shardherd.shared.row_checks import checked_counts, checked_throughput, decoded
from shardherd.shared.worker import LeaseProgress, lease_progress_fields

LEASE_KEY = "leaseKey"
LEASE_OWNER = "leaseOwner"
LEASE_COUNTER = "leaseCounter"
OWNER_SWITCHES = "ownerSwitchesSinceCheckpoint"
CHECKPOINT = "checkpoint"
CHECKPOINT_SUB = "checkpointSubSequenceNumber"
PENDING_CHECKPOINT = "pendingCheckpoint"
PENDING_CHECKPOINT_SUB = "pendingCheckpointSubSequenceNumber"
PENDING_CHECKPOINT_STATE = "pendingCheckpointState"
PARENT_SHARD_IDS = "parentShardId"
CHILD_SHARD_IDS = "childShardIds"
STARTING_HASH_KEY = "startingHashKey"
ENDING_HASH_KEY = "endingHashKey"
THROUGHPUT_KBPS = "throughputKBps"
CHECKPOINT_OWNER = "checkpointOwner"
ENTITY_TYPE = "entityType"
STREAM_NAME = "streamName"
SHARD_ID = "shardId"
# shardherd's progress attributes, written with each checkpoint (Lease.millis_behind_latest etc.).
MILLIS_BEHIND_LATEST = "millisBehindLatest"
RECORDS_PROCESSED = "recordsProcessed"
BYTES_PROCESSED = "bytesProcessed"
RECORDS_BEHIND = "recordsBehind"
CHECKPOINTED_AT = "checkpointedAtMillis"  # the owner's wall clock at the checkpoint (dashboards' checkpoint age)
LAST_MOVE = "lastMove"  # shardherd's: the leader's record of the move that set the owner (Lease.last_move)
PROGRESS_ATTRIBUTES = {"millis_behind_latest": MILLIS_BEHIND_LATEST, "records_processed": RECORDS_PROCESSED,
                       "bytes_processed": BYTES_PROCESSED, "records_behind": RECORDS_BEHIND,
                       "checkpointed_at_millis": CHECKPOINTED_AT}

# shardherd's pause attributes (shared/pause.py): the operator's reason and the worker that stopped for it.
PAUSED = "shardherdPaused"
PAUSED_BY = "shardherdPausedBy"

LEASE_ENTITY = "LEASE"


def is_lease_item(item: Item) -> bool:
    """False for KCL 3.5 single-table items of another kind (worker metrics, leader lock, migration state)."""
    entity = item.get(ENTITY_TYPE)
    if isinstance(entity, dict) and isinstance(entity.get("S"), str):
        return bool(entity["S"] == LEASE_ENTITY)
    return True


def item_key(item: Item) -> str | None:
    """The item's `leaseKey` if it is a string, else None (for error reports)."""
    key = item.get(LEASE_KEY)
    if isinstance(key, dict) and isinstance(key.get("S"), str):
        return str(key["S"])
    return None


def key_of(lease_key: str) -> dict[str, AttributeValue]:
    """The primary key of a lease item."""
    return {LEASE_KEY: string(lease_key)}


def checkpoint_attributes(checkpoint: Checkpoint) -> tuple[AttributeValue, AttributeValue]:
    """The `checkpoint` and `checkpointSubSequenceNumber` values of a checkpoint."""
    return string(checkpoint.sequence_number), integer(checkpoint.sub_sequence_number)


def decode_checkpoint(item: Item, sequence_attribute: str, sub_attribute: str) -> Checkpoint | None:
    """The checkpoint held by a pair of attributes, None when the sequence attribute is absent."""
    sequence = read_string(item, sequence_attribute)
    sub = read_number_text(item, sub_attribute)
    if sequence is None:
        if sub is not None:
            raise AttributeTypeError(f"{sub_attribute} is set but {sequence_attribute} is missing")
        return None
    return parse_checkpoint(sequence, sub)


def decode_lease(item: Item, table: str = "lease") -> Lease:
    """Read a lease item; MalformedLease (with the key when there is one) if any attribute is unreadable.

    A throughput no consumer can use (negative, implausible) is dropped and noted in `repairs`; both cases are
    reported (shared/row_checks.py).
    """
    return decoded(table, lambda: _decode_lease(item), lambda lease: lease.lease_key)


def _decode_lease(item: Item) -> Lease:
    key = item_key(item)
    try:
        if key is None:
            raise AttributeTypeError(f"{LEASE_KEY} is missing or not a string")
        if not is_lease_item(item):
            raise AttributeTypeError(f"{ENTITY_TYPE} is {item[ENTITY_TYPE]['S']!r}, not {LEASE_ENTITY}")
        read_string(item, ENTITY_TYPE)
        checkpoint = decode_checkpoint(item, CHECKPOINT, CHECKPOINT_SUB)
        if checkpoint is None:
            raise AttributeTypeError(f"{CHECKPOINT} is missing")
        fields: dict[str, Any] = {
            "lease_owner": read_string(item, LEASE_OWNER),
            "lease_counter": read_int(item, LEASE_COUNTER) or 0,
            "checkpoint": checkpoint,
            "owner_switches_since_checkpoint": read_int(item, OWNER_SWITCHES) or 0,
            "pending_checkpoint": decode_checkpoint(item, PENDING_CHECKPOINT, PENDING_CHECKPOINT_SUB),
            "pending_checkpoint_state": read_bytes(item, PENDING_CHECKPOINT_STATE),
            "parent_shard_ids": read_string_set(item, PARENT_SHARD_IDS),
            "child_shard_ids": read_string_set(item, CHILD_SHARD_IDS),
            "starting_hash_key": read_string(item, STARTING_HASH_KEY),
            "ending_hash_key": read_string(item, ENDING_HASH_KEY),
            "checkpoint_owner": read_string(item, CHECKPOINT_OWNER),
            "stream_name": read_string(item, STREAM_NAME),
            "shard_id": read_string(item, SHARD_ID),
            "last_move": read_string(item, LAST_MOVE),
            "paused": read_string(item, PAUSED),
            "paused_by": read_string(item, PAUSED_BY),
        }
        fields["throughput_kbps"], throughput_repairs = checked_throughput(read_float(item, THROUGHPUT_KBPS),
                                                                           THROUGHPUT_KBPS)
        progress, progress_repairs = checked_counts({name: read_int(item, name)
                                                     for name in PROGRESS_ATTRIBUTES.values()})
        fields.update({field: progress[name] for field, name in PROGRESS_ATTRIBUTES.items()})
        fields["repairs"] = throughput_repairs + progress_repairs
    except (AttributeTypeError, InvalidCheckpoint) as exc:
        raise MalformedLease(key, str(exc)) from None
    return Lease(lease_key=key, **fields)


def set_progress(update: Expression, progress: LeaseProgress) -> None:
    """Add the owner's progress to a checkpoint update (an unknown lag removes the stored one)."""
    for field, value in lease_progress_fields(progress).items():
        if value is None:
            update.remove(PROGRESS_ATTRIBUTES[field])
        else:
            update.set(PROGRESS_ATTRIBUTES[field], integer(value))


def set_last_move(update: Expression, move: str | None) -> None:
    """Add the leader's record of a move to an owner write (None removes an older one)."""
    if move is None:
        update.remove(LAST_MOVE)
    else:
        update.set(LAST_MOVE, string(move))


def encode_lease(lease: Lease) -> dict[str, AttributeValue]:
    """The item KCL would store for `lease`: every non-empty field; `entityType` is left to the writer."""
    sequence, sub = checkpoint_attributes(lease.checkpoint)
    item: dict[str, AttributeValue] = {
        LEASE_KEY: string(lease.lease_key),
        LEASE_COUNTER: integer(lease.lease_counter),
        CHECKPOINT: sequence,
        CHECKPOINT_SUB: sub,
        OWNER_SWITCHES: integer(lease.owner_switches_since_checkpoint),
    }
    if lease.pending_checkpoint is not None:
        item[PENDING_CHECKPOINT], item[PENDING_CHECKPOINT_SUB] = checkpoint_attributes(lease.pending_checkpoint)
    if lease.pending_checkpoint_state is not None:
        item[PENDING_CHECKPOINT_STATE] = {"B": lease.pending_checkpoint_state}
    if lease.parent_shard_ids:
        item[PARENT_SHARD_IDS] = string_set(lease.parent_shard_ids)
    if lease.child_shard_ids:
        item[CHILD_SHARD_IDS] = string_set(lease.child_shard_ids)
    if lease.throughput_kbps is not None:
        item[THROUGHPUT_KBPS] = rounded_micro(lease.throughput_kbps)
    for field, name in PROGRESS_ATTRIBUTES.items():
        if (figure := getattr(lease, field)) is not None:
            item[name] = integer(figure)
    optional_strings = {
        LEASE_OWNER: lease.lease_owner,
        STARTING_HASH_KEY: lease.starting_hash_key,
        ENDING_HASH_KEY: lease.ending_hash_key,
        CHECKPOINT_OWNER: lease.checkpoint_owner,
        STREAM_NAME: lease.stream_name,
        SHARD_ID: lease.shard_id,
        LAST_MOVE: lease.last_move,
        PAUSED: lease.paused,
        PAUSED_BY: lease.paused_by,
    }
    item.update({name: string(value) for name, value in optional_strings.items() if value is not None})
    return item
