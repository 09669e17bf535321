"""Facts about GetRecords' JSON records (base64 `Data`, epoch-second arrivals) without decoding every payload.

Used by the executors' reads (agent/spark/arrow_read.py) and the driver's probe (agent/spark/probe.py).
"""

from __future__ import annotations

import binascii
from typing import Any

from shardherd.agent.kpl import BrokenAggregate, is_aggregate
from shardherd.agent.kpl_decoding import decode_aggregate
from shardherd.shared.checkpoint import Checkpoint


def data_size(encoded: str) -> int:
    """Bytes of a base64 payload, without decoding it."""
    return len(encoded) * 3 // 4 - encoded.endswith("=") - encoded.endswith("==")


def last_sub_sequence(record: dict[str, Any]) -> int:
    """The sub-sequence number of a Kinesis record's last user record (0 unless it is a KPL aggregate)."""
    data = binascii.a2b_base64(record["Data"])
    if not is_aggregate(data):
        return 0
    try:
        return len(decode_aggregate(data)) - 1
    except BrokenAggregate:
        return 0  # delivered raw, as one record


def record_end(record: dict[str, Any]) -> Checkpoint:
    """The checkpoint covering the whole of a Kinesis record (its last user record)."""
    return Checkpoint.at(str(record["SequenceNumber"]), last_sub_sequence(record))


def skip_covered(records: list[dict[str, Any]], skip: Checkpoint | None) -> list[dict[str, Any]]:
    """Drop the record at an AT_SEQUENCE_NUMBER start if the checkpoint covers all of its user records."""
    if skip is None or not records or str(records[0]["SequenceNumber"]) != skip.sequence_number:
        return records
    if last_sub_sequence(records[0]) <= skip.sub_sequence_number:
        return records[1:]
    return records
