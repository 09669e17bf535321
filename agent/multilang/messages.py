"""The MultiLang protocol's messages: one JSON object per line, `action` naming each.

To the child: initialize (shardId, sequenceNumber, subSequenceNumber of the checkpoint it resumes from),
processRecords (records, millisBehindLatest), leaseLost, shardEnded, shutdownRequested, and checkpoint (the answer
to the child's checkpoint: its sequenceNumber and subSequenceNumber echoed, `error` the name of the Java exception
the daemon would have thrown, or null). From the child: status (responseFor: the action it completed) and
checkpoint (sequenceNumber and subSequenceNumber, either may be null).

Invariants: every message carries every field the daemon writes (nulls included: amazon-kclpy indexes them without
defaults); record data is base64 (how the daemon's JSON library writes a byte array); a line that is not a JSON
object with a known action is not a message (the daemon skips such lines, as processors may print to stdout).
"""

from __future__ import annotations

import binascii
import json
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _quoted
from typing import Any

from shardherd.agent.records import Record
from shardherd.shared.checkpoint import Checkpoint

INITIALIZE = "initialize"
PROCESS_RECORDS = "processRecords"
LEASE_LOST = "leaseLost"
SHARD_ENDED = "shardEnded"
SHUTDOWN_REQUESTED = "shutdownRequested"
CHECKPOINT = "checkpoint"
STATUS = "status"

# The names of the exceptions KCL's checkpointer throws, as the daemon passes them to the child.
SHUTDOWN_EXCEPTION = "ShutdownException"  # the lease is no longer this worker's
INVALID_STATE = "InvalidStateException"  # no checkpointer in this call, or the store refused for good
DEPENDENCY_EXCEPTION = "KinesisClientLibDependencyException"  # the store did not answer in time
ILLEGAL_ARGUMENT = "IllegalArgumentException"  # not a sequence number, or outside [last checkpoint, last delivered]


def _line(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def initialize(shard_id: str, start: Checkpoint) -> bytes:
    """The first message to a child: its shard and the checkpoint the shard resumes from."""
    return _line({"action": INITIALIZE, "shardId": shard_id, "sequenceNumber": start.sequence_number,
                  "subSequenceNumber": start.sub_sequence_number})


# One record of a processRecords line, as the daemon writes it (KPL sub-records carry their aggregate's sequence
# number). Written from this template rather than through json.dumps of a dict per record: a batch is the agent's
# largest encoding job (a fifth of its GIL time draining a backlog, py-spy; decision 0024). Every string goes through
# the JSON encoder's own escaping (ASCII, as json.dumps writes by default); the data is base64, which needs none.
_RECORD = ('{"action":"record","data":"%s","partitionKey":%s,"sequenceNumber":%s,"subSequenceNumber":%d,'
           '"approximateArrivalTimestamp":%s}')


def _record(record: Record) -> str:
    arrival = record.approximate_arrival_timestamp
    return _RECORD % (binascii.b2a_base64(record.data, newline=False).decode("ascii"),
                      _quoted(record.partition_key), _quoted(record.sequence_number), record.sub_sequence_number,
                      "null" if arrival is None else int(arrival.timestamp() * 1000))


def process_records(records: list[Record], millis_behind_latest: int | None) -> bytes:
    """A batch of records."""
    lag = "null" if millis_behind_latest is None else int(millis_behind_latest)
    return (f'{{"action":"{PROCESS_RECORDS}","records":[{",".join(map(_record, records))}],'
            f'"millisBehindLatest":{lag}}}\n').encode("ascii")


def bare(action: str) -> bytes:
    """leaseLost, shardEnded or shutdownRequested: the action alone."""
    return _line({"action": action})


def checkpoint_reply(sequence_number: str | None, sub_sequence_number: int | None, error: str | None) -> bytes:
    """The answer to a child's checkpoint request: its position echoed, and the error's name or null."""
    return _line({"action": CHECKPOINT, "sequenceNumber": sequence_number, "subSequenceNumber": sub_sequence_number,
                  "error": error})


@dataclass(frozen=True, slots=True)
class Status:
    """The child finished handling an action."""

    response_for: str | None


@dataclass(frozen=True, slots=True)
class CheckpointRequest:
    """The child asks for a checkpoint: at a position, or (both None) after the last record delivered."""

    sequence_number: str | None
    sub_sequence_number: int | None


ChildMessage = Status | CheckpointRequest


def parse(line: str) -> ChildMessage | None:
    """The message a line of the child's stdout holds, or None for any other line (skipped, as the daemon does)."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    action = data.get("action")
    if action == STATUS:
        response_for = data.get("responseFor")
        return Status(response_for if isinstance(response_for, str) else None)
    if action == CHECKPOINT:
        sequence, sub = data.get("sequenceNumber"), data.get("subSequenceNumber")
        return CheckpointRequest(None if sequence is None else str(sequence),
                                 sub if isinstance(sub, int) and not isinstance(sub, bool) else None)
    return None
