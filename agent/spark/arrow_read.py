"""Executor reads of one shard plan, as Arrow record batches: exactly the plan's records, whatever the attempt.

A plan fixes its first and last record (agent/spark/offsets.py), so a read goes from the start position through the
end record (all of its user records) and stops there: a task retried after a lost executor, or a batch replayed
after a crash, yields the same rows. Records are handed over per GetRecords response as columns: payloads are
base64-decoded with `binascii` in one pass, arrival times (epoch seconds in the JSON) become a timestamp column in
one Arrow cast, and KPL aggregates are expanded into their user records.
"""

from __future__ import annotations

import binascii
import os
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from agent.kpl import BrokenAggregate, decode_aggregate, is_aggregate
from agent.read_spec import MAX_RECORDS_PER_CALL, StartPosition
from agent.reader import ShardReadError
from agent.spark.kinesis_raw import IteratorExpired, RawKinesis
from agent.spark.offsets import ShardPlan
from shared.checkpoint import Checkpoint

ARROW_FIELDS = [
    pa.field("shard_id", pa.string()), pa.field("sequence_number", pa.string()),
    pa.field("sub_sequence_number", pa.int64()), pa.field("partition_key", pa.string()),
    pa.field("arrival_timestamp", pa.timestamp("us", tz="UTC")), pa.field("data", pa.binary()),
]
ARROW_SCHEMA = pa.schema(ARROW_FIELDS)
READER_SCHEMA = pa.schema([*ARROW_FIELDS, pa.field("reader_pid", pa.int32())])
END_WAIT_SECONDS = 60.0  # how long a read waits for its planned end record to become readable before failing


class PlannedEndMissing(ShardReadError):
    """A read could not reach the record its plan ends at (shard ended before it, or it stayed invisible)."""


class Columns:
    """Column lists of user records being collected for one Arrow batch."""

    def __init__(self) -> None:
        self.sequence: list[str] = []
        self.sub: list[int] = []
        self.key: list[str] = []
        self.arrival: list[float | None] = []
        self.data: list[bytes] = []

    def add(self, record: dict[str, Any], skip_through: int = -1) -> None:
        """Append one Kinesis record's user records (those with a sub-sequence above `skip_through`)."""
        payload = binascii.a2b_base64(record["Data"])
        sequence = record["SequenceNumber"]
        arrival = record.get("ApproximateArrivalTimestamp")
        if is_aggregate(payload):
            try:
                users = decode_aggregate(payload)
            except BrokenAggregate:
                users = None
            if users is not None:
                for index, user in enumerate(users):
                    if index > skip_through:
                        self._append(sequence, index, user.partition_key, arrival, user.data)
                return
        if skip_through < 0:
            self._append(sequence, 0, record["PartitionKey"], arrival, payload)

    def _append(self, sequence: str, sub: int, key: str, arrival: float | None, data: bytes) -> None:
        self.sequence.append(sequence)
        self.sub.append(sub)
        self.key.append(key)
        self.arrival.append(arrival)
        self.data.append(data)

    def batch(self, shard_id: str, include_reader: bool) -> pa.RecordBatch:
        """The collected rows as one Arrow batch in the source's schema."""
        count = len(self.sequence)
        micros = pa.array([None if value is None else round(value * 1_000_000) for value in self.arrival],
                          pa.int64())
        columns = [pa.array([shard_id] * count, pa.string()), pa.array(self.sequence, pa.string()),
                   pa.array(self.sub, pa.int64()), pa.array(self.key, pa.string()),
                   micros.cast(pa.timestamp("us", tz="UTC")), pa.array(self.data, pa.binary())]
        if include_reader:
            columns.append(pa.array([os.getpid()] * count, pa.int32()))
            return pa.RecordBatch.from_arrays(columns, schema=READER_SCHEMA)
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def within_end(records: list[dict[str, Any]], end: int) -> tuple[list[dict[str, Any]], bool]:
    """The records at or before sequence `end`, and whether the end was reached (or passed)."""
    if not records or int(records[-1]["SequenceNumber"]) < end:
        return records, False
    for index, record in enumerate(records):
        if int(record["SequenceNumber"]) >= end:
            keep = index + 1 if int(record["SequenceNumber"]) == end else index
            return records[:keep], True
    return records, True  # pragma: no cover - the last record is >= end


def read_plan(kinesis: RawKinesis, stream: str, plan: ShardPlan, include_reader: bool = False,
              min_call_interval: float = 0.0) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the plan's records, from its start through its end record; PlannedEndMissing if unreachable."""
    position: StartPosition = plan.position
    skip: Checkpoint | None = position.skips_through
    end = int(plan.end.sequence_number)
    iterator: str | None = kinesis.get_shard_iterator(stream, plan.shard_id, position.iterator_arguments())
    remaining = max(1, plan.records)
    deadline: float | None = None
    next_call = 0.0
    while True:
        if iterator is None:
            raise PlannedEndMissing(f"{plan.shard_id} ended before its planned end {plan.end}")
        pause = next_call - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        next_call = time.monotonic() + min_call_interval
        try:
            response = kinesis.get_records(iterator, min(MAX_RECORDS_PER_CALL, remaining + 1))
        except IteratorExpired:
            iterator = kinesis.get_shard_iterator(stream, plan.shard_id, position.iterator_arguments())
            skip = position.skips_through
            continue
        records, reached = within_end(response.get("Records", []), end)
        if records:
            columns = Columns()
            first = 0
            if skip is not None and records[0]["SequenceNumber"] == skip.sequence_number:
                columns.add(records[0], skip.sub_sequence_number)
                first = 1
            for record in records[first:]:
                columns.add(record)
            skip = None
            remaining = max(1, remaining - len(records))
            position = StartPosition.after(Checkpoint(str(records[-1]["SequenceNumber"])), record_complete=True)
            deadline = None
            yield columns.batch(plan.shard_id, include_reader)
        if reached:
            return
        iterator = response.get("NextShardIterator")
        if not records:
            deadline = deadline or time.monotonic() + END_WAIT_SECONDS
            if time.monotonic() > deadline:
                raise PlannedEndMissing(f"{plan.shard_id}: planned end {plan.end} not readable after "
                                        f"{END_WAIT_SECONDS:.0f} s")
            if not response.get("MillisBehindLatest"):
                next_call = max(next_call, time.monotonic() + 0.05)
