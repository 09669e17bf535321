"""Executor reads of one shard plan, as Arrow record batches: exactly the plan's records, whatever the attempt.

A plan fixes its start and caps (agent/spark/offsets.py). Its first read takes records up to the caps or until it
caught up with the shard, records where it stopped (agent/spark/batch_ends.py) and only then hands the rows out;
every later read (a task retried after a lost executor, a second action of the sink, a batch replayed after a
crash) gives the rows from the start through that recorded end and stops there, so it yields the same rows. Each
read reads the hold's item while it reads the shard (the store's answer decides which of the two it is). A read starts
from the plan's iterator (the previous read's NextShardIterator) when it has one: GetShardIterator only for a new
hold, an expired iterator or a position that moved. Records are handed over per GetRecords response as columns:
payloads are base64-decoded with `binascii` in one pass, arrival times (epoch seconds in the JSON) become a
timestamp column in one Arrow cast, and KPL aggregates are expanded into their user records.
"""

from __future__ import annotations

import binascii
import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from shardherd.agent.kpl import MAGIC, BrokenAggregate, is_aggregate
from shardherd.agent.kpl_decoding import decode_columns
from shardherd.agent.read_spec import MAX_RECORDS_PER_CALL, StartPosition
from shardherd.agent.reader import ReaderStats, ShardReadError
from shardherd.agent.spark.batch_ends import BatchEnd, end_of_plan, record_over, stored_end
from shardherd.agent.spark.kinesis_raw import IteratorExpired, RawKinesis
from shardherd.agent.spark.kinesis_records import data_size, skip_covered
from shardherd.agent.spark.kinesis_records import record_end as record_checkpoint
from shardherd.agent.spark.offsets import ShardPlan
from shardherd.agent.spark.read_ahead import READS_AHEAD, behind, first_answer
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.store import LeaseStore
from shardherd.shared.streams import read_target

ARROW_FIELDS = [
    pa.field("shard_id", pa.string()), pa.field("sequence_number", pa.string()),
    pa.field("sub_sequence_number", pa.int64()), pa.field("partition_key", pa.string()),
    pa.field("arrival_timestamp", pa.timestamp("us", tz="UTC")), pa.field("data", pa.binary()),
    pa.field("stream_name", pa.string()),
]
ARROW_SCHEMA = pa.schema(ARROW_FIELDS)
READER_SCHEMA = pa.schema([*ARROW_FIELDS, pa.field("reader_pid", pa.int32())])
END_WAIT_SECONDS = 60.0  # how long a read waits for its recorded end record to become readable before failing
OPEN_READ_SECONDS = 1.0  # how long a first read keeps calling through empty answers while Kinesis says it is behind
_T = TypeVar("_T")
QUEUED_RESPONSES = 4  # Arrow batches (GetRecords responses) a shard read may hold ahead of the one being handed over


class PlannedEndMissing(ShardReadError):
    """A read could not reach the recorded end of its plan (shard ended before it, or it stayed invisible)."""


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


class _Pacer:
    """Spaces one read's GetRecords calls at least `interval` seconds apart."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next = 0.0

    def wait(self) -> None:
        pause = self._next - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        self._next = time.monotonic() + self.interval

    def idle(self) -> None:
        """An empty answer at the tip: the next call waits a little longer."""
        self._next = max(self._next, time.monotonic() + 0.05)


class _Taken:
    """What an open read took so far, within the plan's caps and its `until`."""

    def __init__(self, plan: ShardPlan) -> None:
        self.caps = plan.caps
        self.until = plan.until
        self.records = self.bytes = 0
        self.end: Checkpoint | None = None
        self.first_arrival: float | None = None
        self.last_arrival: float | None = None

    def room(self) -> int:
        """Kinesis records the read may still take (0: a cap is reached)."""
        full = self.caps.max_bytes is not None and self.bytes >= self.caps.max_bytes
        return 0 if full else self.caps.max_records - self.records

    def take(self, records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
        """The leading records within the caps and `until` (at least one while none was taken); True if cut short."""
        taken = 0
        for record in records:
            arrival = record.get("ApproximateArrivalTimestamp")
            size = data_size(record["Data"])
            over_bytes = self.caps.max_bytes is not None and self.bytes + size > self.caps.max_bytes
            late = self.until is not None and arrival is not None and float(arrival) > self.until
            if late or self.room() == 0 or (over_bytes and self.records > 0):
                break
            taken += 1
            self.records += 1
            self.bytes += size
            if arrival is not None:
                self.first_arrival = float(arrival) if self.first_arrival is None else self.first_arrival
                self.last_arrival = float(arrival)
        if taken:
            self.end = record_checkpoint(records[taken - 1])
        return records[:taken], taken < len(records)


def read_open(kinesis: RawKinesis, target: tuple[str, str], plan: ShardPlan, include_reader: bool = False,
              min_call_interval: float = 0.0) -> tuple[list[pa.RecordBatch], BatchEnd]:
    """The first read of a plan: records from its start within its caps, until caught up; where it stopped.

    It stops at a cap, at the first record after `until`, at the shard's tip (MillisBehindLatest 0) or its end, or
    after OPEN_READ_SECONDS of empty answers while behind. Rows are held until the caller recorded the end; the end
    carries the read's calls and throttles. Its first answer is the hold's read ahead when one was made on the plan's
    iterator (agent/spark/read_ahead.py).
    """
    stream, shard = target
    position: StartPosition = plan.position
    skip: Checkpoint | None = position.skips_through
    stats = ReaderStats()
    iterator: str | None = plan.iterator or kinesis.get_shard_iterator(stream, shard, position.iterator_arguments(),
                                                                       stats)
    taken, pacer, batches = _Taken(plan), _Pacer(min_call_interval), []
    ahead = READS_AHEAD.take(plan.tenure, plan.iterator) if plan.iterator else None
    millis_behind: int | None = None
    at_tip = False
    deadline = time.monotonic() + OPEN_READ_SECONDS
    while iterator is not None and taken.room() > 0:
        pacer.wait()
        limit = min(MAX_RECORDS_PER_CALL, taken.room())
        try:
            response = first_answer(kinesis, iterator, limit, stats, ahead)
        except IteratorExpired:
            iterator = kinesis.get_shard_iterator(stream, shard, position.iterator_arguments(), stats)
            skip = position.skips_through
            continue
        finally:
            ahead = None
        answered = response.get("Records", [])
        records, cut = taken.take(skip_covered(answered, skip))
        millis_behind = _behind(response)
        at_tip = millis_behind == 0 and len(answered) < limit and not cut
        if records:
            skip_through = _partial(records, skip)
            skip = None
            position = StartPosition.after(Checkpoint(str(records[-1]["SequenceNumber"])), record_complete=True)
            batches.append(arrow_batch(stream, shard, records, include_reader, skip_through))
        iterator = None if cut else response.get("NextShardIterator")
        if cut or at_tip or (not records and time.monotonic() > deadline):
            break
        if not records:
            pacer.idle()
    end = BatchEnd(plan.tenure, plan.run, plan.number, taken.end, taken.records, taken.bytes, iterator, millis_behind,
                   taken.first_arrival, taken.last_arrival, at_tip, stats.get_records_calls, stats.throttled)
    return batches, end


def _behind(response: dict[str, Any]) -> int | None:
    behind = response.get("MillisBehindLatest")
    return None if behind is None else int(behind)


def _partial(records: list[dict[str, Any]], skip: Checkpoint | None) -> int:
    """The sub-sequence to skip through in the first record (a start inside an aggregate), else -1."""
    if skip is not None and records[0]["SequenceNumber"] == skip.sequence_number:
        return skip.sub_sequence_number
    return -1


def read_through(kinesis: RawKinesis, target: tuple[str, str], plan: ShardPlan, recorded: BatchEnd,
                 include_reader: bool = False, min_call_interval: float = 0.0) -> Iterator[pa.RecordBatch]:
    """Arrow batches of a plan read again: from its start through its recorded end; PlannedEndMissing if unreachable."""
    if recorded.end is None:
        return
    stream, shard = target
    position: StartPosition = plan.position
    skip: Checkpoint | None = position.skips_through
    end = int(recorded.end.sequence_number)
    iterator: str | None = plan.iterator or kinesis.get_shard_iterator(stream, shard, position.iterator_arguments())
    remaining = max(1, recorded.records)
    deadline: float | None = None
    pacer = _Pacer(min_call_interval)
    while True:
        if iterator is None:
            raise PlannedEndMissing(f"{plan.shard_id} ended before its recorded end {recorded.end}")
        pacer.wait()
        try:
            response = kinesis.get_records(iterator, min(MAX_RECORDS_PER_CALL, remaining + 1))
        except IteratorExpired:
            iterator = kinesis.get_shard_iterator(stream, shard, position.iterator_arguments())
            skip = position.skips_through
            continue
        records, reached = within_end(skip_covered(response.get("Records", []), skip), end)
        if records:
            skip_through = _partial(records, skip)
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
                raise PlannedEndMissing(f"{plan.shard_id}: recorded end {recorded.end} not readable after "
                                        f"{END_WAIT_SECONDS:.0f} s")
            if not response.get("MillisBehindLatest"):
                pacer.idle()


def read_plan(kinesis: RawKinesis, store: LeaseStore, stream: str, plan: ShardPlan, include_reader: bool = False,
              min_call_interval: float = 0.0, read_ahead_after: float | None = None) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the plan's records: exactly those of its recorded end, which the first read records.

    The hold's item is read while the shard is read from the plan's start (one store round trip off the read's
    path): a first read then records its end over that item; a read of a plan whose end is already recorded (a
    retried task, a second action, a replay) keeps its rows through that end, and reads on from the start only
    if they do not reach it. `stream` is the stream of a single-stream application; a multi-stream plan names its
    stream in its key. A first read that found the pipeline behind (its records spanned `read_ahead_after` seconds
    of arrivals) starts the next plan's first call before it hands its rows over (agent/spark/read_ahead.py).
    """
    target = read_target(plan.shard_id, stream)
    stored_read = _in_background(lambda: stored_end(store, plan.tenure))
    batches, end = read_open(kinesis, target, plan, include_reader, min_call_interval)
    stored = stored_read.result()
    recorded = end_of_plan(stored, plan.tenure, plan.run, plan.number)
    if recorded is None:
        recorded = record_over(store, end, stored)  # two store calls per first read: this and `stored_end`
        if recorded == end:  # this read fixed the end: its rows are the plan's
            if end.iterator is not None and plan.until is None and behind(end, read_ahead_after):
                READS_AHEAD.start(kinesis, plan.tenure, end.iterator, min(MAX_RECORDS_PER_CALL, plan.caps.max_records),
                                 min_call_interval)
            yield from batches
            return
    if recorded.end is None:
        return
    kept, reached = through_sequence(batches, int(recorded.end.sequence_number))
    if reached:
        yield from kept
        return
    yield from read_through(kinesis, target, plan, recorded, include_reader, min_call_interval)


def through_sequence(batches: list[pa.RecordBatch], end: int) -> tuple[list[pa.RecordBatch], bool]:
    """The leading rows of `batches` (a read from a plan's start) through Kinesis sequence `end`.

    True if a row of that record is among them: the rows are then exactly the plan's through that end.
    """
    kept: list[pa.RecordBatch] = []
    for batch in batches:
        sequences = [int(sequence) for sequence in batch.column(1).to_pylist()]
        count = sum(1 for sequence in sequences if sequence <= end)
        if count:
            kept.append(batch.slice(0, count))
        if count < len(sequences) or (sequences and sequences[-1] == end):
            return kept, count > 0 and sequences[count - 1] == end
    return kept, False


def _in_background(call: Callable[[], _T]) -> Future[_T]:
    """`call()` run on its own thread (a store call overlapped with a Kinesis call), as a future."""
    future: Future[_T] = Future()

    def run() -> None:
        try:
            future.set_result(call())
        except BaseException as exc:  # handed to the caller of `result()`
            future.set_exception(exc)

    threading.Thread(target=run, name="batch-end-read", daemon=True).start()
    return future


def read_plans(kinesis: RawKinesis, store: LeaseStore, stream: str, plans: tuple[ShardPlan, ...],
               include_reader: bool = False, min_call_interval: float = 0.0,
               read_ahead_after: float | None = None) -> Iterator[pa.RecordBatch]:
    """Arrow batches of several plans (one partition of shards, planning.group_plans), their shards read at once.

    Each plan is read by its own thread, as `read_plan` reads it, into a queue of QUEUED_RESPONSES; the batches
    come out plan after plan in the partition's order, so the rows are those of the plans, in the same order, on
    every read. The first failure of any plan fails the partition; closing the iterator stops the threads.
    """
    if len(plans) == 1:
        yield from read_plan(kinesis, store, stream, plans[0], include_reader, min_call_interval, read_ahead_after)
        return
    stop = threading.Event()
    queues: list[queue.Queue[object]] = [queue.Queue(QUEUED_RESPONSES) for _ in plans]
    for plan, out in zip(plans, queues, strict=True):
        batches = read_plan(kinesis, store, stream, plan, include_reader, min_call_interval, read_ahead_after)
        threading.Thread(target=_fill, args=(batches, out, stop), name=f"read-{plan.shard_id}", daemon=True).start()
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
