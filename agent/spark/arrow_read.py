"""Executor reads of one shard plan, as Arrow record batches: exactly the plan's records, whatever the attempt.

A plan fixes its first and last record (agent/spark/offsets.py), so a read goes from the start position through the
end record (all of its user records) and stops there: a task retried after a lost executor, or a batch replayed
after a crash, yields the same rows. Records are handed over per GetRecords response as columns: payloads are
base64-decoded with `binascii` in one pass, arrival times (epoch seconds in the JSON) become a timestamp column in
one Arrow cast, and KPL aggregates are expanded into their user records.
"""

from __future__ import annotations

import binascii
import contextlib
import os
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from shardherd.agent.kpl import MAGIC, BrokenAggregate, is_aggregate
from shardherd.agent.kpl_decoding import decode_columns
from shardherd.agent.read_spec import MAX_RECORDS_PER_CALL, StartPosition
from shardherd.agent.reader import ShardReadError
from shardherd.agent.spark.kinesis_raw import IteratorExpired, RawKinesis
from shardherd.agent.spark.offsets import ShardPlan
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.streams import read_target

ARROW_FIELDS = [
    pa.field("shard_id", pa.string()), pa.field("sequence_number", pa.string()),
    pa.field("sub_sequence_number", pa.int64()), pa.field("partition_key", pa.string()),
    pa.field("arrival_timestamp", pa.timestamp("us", tz="UTC")), pa.field("data", pa.binary()),
    pa.field("stream_name", pa.string()),
]
ARROW_SCHEMA = pa.schema(ARROW_FIELDS)
READER_SCHEMA = pa.schema([*ARROW_FIELDS, pa.field("reader_pid", pa.int32())])
END_WAIT_SECONDS = 60.0  # how long a read waits for its planned end record to become readable before failing
READ_AHEAD = 4  # Arrow batches (GetRecords responses) a shard read may hold ahead of the one being handed over


class PlannedEndMissing(ShardReadError):
    """A read could not reach the record its plan ends at (shard ended before it, or it stayed invisible)."""


def arrow_batch(stream: str, shard_id: str, records: list[dict[str, Any]], include_reader: bool,
                skip_through: int = -1) -> pa.RecordBatch:
    """One GetRecords response's user records as an Arrow batch in the source's schema.

    Payloads are decoded in one comprehension; a response without KPL aggregates (the usual case) is turned into
    columns without any per-record Python beyond that. `skip_through` drops the first record's user records up to
    that sub-sequence (a read resuming inside an aggregate).
    """
    payloads = [binascii.a2b_base64(record["Data"]) for record in records]
    if skip_through < 0 and not any(payload[:4] == MAGIC for payload in payloads):
        count = len(records)
        return _batch((stream, shard_id), [record["SequenceNumber"] for record in records], [0] * count,
                      [record["PartitionKey"] for record in records],
                      [record.get("ApproximateArrivalTimestamp") for record in records], payloads, include_reader)
    columns: tuple[list[Any], ...] = ([], [], [], [], [])
    for index, (record, payload) in enumerate(zip(records, payloads, strict=True)):
        _expand(columns, record, payload, skip_through if index == 0 else -1)
    sequence, sub, key, arrival, data = columns
    return _batch((stream, shard_id), sequence, sub, key, arrival, data, include_reader)


def _expand(columns: tuple[list[Any], ...], record: dict[str, Any], payload: bytes, skip_through: int) -> None:
    """Append one Kinesis record's user records (sub-sequence above `skip_through`) to the column lists."""
    sequence, arrival = record["SequenceNumber"], record.get("ApproximateArrivalTimestamp")
    keys: list[str] = [record["PartitionKey"]]
    payloads = [payload]
    if is_aggregate(payload):
        with contextlib.suppress(BrokenAggregate):  # a broken aggregate is delivered raw, as one record
            keys, payloads = decode_columns(payload)
    first = skip_through + 1
    count = max(0, len(keys) - first)
    sequences, subs, key_column, arrivals, data_column = columns
    sequences.extend([sequence] * count)
    subs.extend(range(first, first + count))
    key_column.extend(keys[first:])
    arrivals.extend([arrival] * count)
    data_column.extend(payloads[first:])


def _batch(where: tuple[str, str], sequence: list[str], sub: list[int], key: list[str],
           arrival: list[float | None], data: list[bytes], include_reader: bool) -> pa.RecordBatch:
    stream, shard_id = where
    count = len(sequence)
    seconds = pa.array(arrival, pa.float64())
    micros = pc.cast(pc.round(pc.multiply(seconds, 1_000_000)), pa.int64())
    columns = [pa.array([shard_id] * count, pa.string()), pa.array(sequence, pa.string()), pa.array(sub, pa.int64()),
               pa.array(key, pa.string()), micros.cast(pa.timestamp("us", tz="UTC")), pa.array(data, pa.binary()),
               pa.array([stream] * count, pa.string())]
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
    """Arrow batches of the plan's records, from its start through its end record; PlannedEndMissing if unreachable.

    `stream` is the stream of a single-stream application; a multi-stream plan names its stream in its key.
    """
    stream, shard = read_target(plan.shard_id, stream)
    position: StartPosition = plan.position
    skip: Checkpoint | None = position.skips_through
    end = int(plan.end.sequence_number)
    iterator: str | None = kinesis.get_shard_iterator(stream, shard, position.iterator_arguments())
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
            iterator = kinesis.get_shard_iterator(stream, shard, position.iterator_arguments())
            skip = position.skips_through
            continue
        records, reached = within_end(response.get("Records", []), end)
        if records:
            skip_through = (skip.sub_sequence_number if skip is not None
                            and records[0]["SequenceNumber"] == skip.sequence_number else -1)
            skip = None
            remaining = max(1, remaining - len(records))
            position = StartPosition.after(Checkpoint(str(records[-1]["SequenceNumber"])), record_complete=True)
            deadline = None
            yield arrow_batch(stream, shard, records, include_reader, skip_through)
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


def read_plans(kinesis: RawKinesis, stream: str, plans: tuple[ShardPlan, ...], include_reader: bool = False,
               min_call_interval: float = 0.0) -> Iterator[pa.RecordBatch]:
    """Arrow batches of several plans (one partition of shards, planning.group_plans), their shards read at once.

    Each plan is read by its own thread, as `read_plan` reads it, into a queue of READ_AHEAD responses; the batches
    come out plan after plan in the partition's order, so the rows are those of the plans, in the same order, on
    every read. The first failure of any plan fails the partition; closing the iterator stops the threads.
    """
    if len(plans) == 1:
        yield from read_plan(kinesis, stream, plans[0], include_reader, min_call_interval)
        return
    stop = threading.Event()
    queues: list[queue.Queue[object]] = [queue.Queue(READ_AHEAD) for _ in plans]
    for plan, out in zip(plans, queues, strict=True):
        threading.Thread(target=_fill, args=(read_plan(kinesis, stream, plan, include_reader, min_call_interval),
                                             out, stop), name=f"read-{plan.shard_id}", daemon=True).start()
    try:
        for out in queues:
            while (item := out.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
    finally:
        stop.set()


_DONE = object()


def _fill(batches: Iterator[pa.RecordBatch], out: queue.Queue[object], stop: threading.Event) -> None:
    """Move one plan's batches into `out`, then _DONE (or the exception that ended the read); give up on `stop`."""
    try:
        for batch in batches:
            if not _offer(out, batch, stop):
                return
    except BaseException as exc:  # handed to the consuming task, which raises it there
        _offer(out, exc, stop)
        return
    _offer(out, _DONE, stop)


def _offer(out: queue.Queue[object], item: object, stop: threading.Event) -> bool:
    while not stop.is_set():
        with contextlib.suppress(queue.Full):
            out.put(item, timeout=0.1)
            return True
    return False
