"""Deterministic replay: a plan read again gives the same rows, and no checkpoint passes a record never written.

The first read of a plan records where it stopped; every other read follows that record. Reads go through
kinesalite over HTTP; the Spark test reruns each batch's partitions inside the sink (no persist:
the second action recomputes every partition, as Spark does for a lost block or a re-executed task) while new
records keep arriving, and checks the lease checkpoints against what was written at every batch.
"""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from shardherd.agent.kpl import UserRecord, encode_aggregate
from shardherd.agent.read_spec import StartPosition
from shardherd.agent.reader import ShardNotFound
from shardherd.agent.spark.arrow_read import arrow_batch, read_plan, read_plans, through_sequence
from shardherd.agent.spark.batch_ends import recorded_end
from shardherd.agent.spark.kinesis_raw import RawKinesis
from shardherd.agent.spark.offsets import Caps, ShardPlan
from shardherd.agent.spark.probe import Prober
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import TRIM_HORIZON, Checkpoint
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.store import TableNames
from tests.spark.conftest import SparkStack
from tests.support.stores import unique_app
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def _put(kinesis: Any, stream: str, payloads: list[bytes]) -> None:
    kinesis.put_records(StreamName=stream, Records=[{"Data": data, "PartitionKey": "k"} for data in payloads])


def _table(batches: list[pa.RecordBatch]) -> list[tuple[str, int, bytes]]:
    return [(row["sequence_number"], row["sub_sequence_number"], row["data"])
            for batch in batches for row in batch.to_pylist()]


def _store() -> MemoryLeaseStore:
    return MemoryLeaseStore(TableNames.for_application("replay"))


def test_a_plan_read_again_after_more_records_arrived_gives_the_same_rows(
        kinesalite: NodeEmulator) -> None:
    stream = unique_app("replay")
    kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    kinesis.create_stream(StreamName=stream, ShardCount=1)
    wait_for(lambda: kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"]
             == "ACTIVE", 30, "stream active")
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    aggregate = encode_aggregate([UserRecord("k", f"agg-{index}".encode()) for index in range(3)])
    _put(kinesis, stream, [b"a-0", b"a-1", aggregate, b"a-2"])
    _put(kinesis, stream, [aggregate])  # the read ends at an aggregate: the end covers all of it

    raw = RawKinesis("us-east-1", kinesalite.endpoint_url)
    probe = Prober(raw, stream).probe(shard, StartPosition.after(TRIM_HORIZON), None)
    assert probe.pending and probe.iterator is not None and probe.first_arrival is not None
    store = _store()
    plan = ShardPlan(shard, StartPosition.after(TRIM_HORIZON), Caps(100), "t", "r", 1, probe.iterator)

    first = _table(list(read_plan(raw, store, stream, plan)))
    recorded = recorded_end(store, "t", "r", 1)
    assert recorded is not None and (recorded.records, recorded.caught_up) == (5, True)  # read to the tip
    assert recorded.end == Checkpoint(first[-1][0], 2)  # the end covers the whole last aggregate
    _put(kinesis, stream, [b"later-0", b"later-1"])
    second = _table(list(read_plan(raw, store, stream, plan)))
    assert first == second  # a re-executed partition returns exactly the same rows
    assert [data for *_, data in first] == [b"a-0", b"a-1", b"agg-0", b"agg-1", b"agg-2", b"a-2",
                                            b"agg-0", b"agg-1", b"agg-2"]

    capped = ShardPlan(shard, StartPosition.after(TRIM_HORIZON), Caps(2), "t2", "r", 1)
    assert [data for *_, data in _table(list(read_plan(raw, store, stream, capped)))] == [b"a-0", b"a-1"]
    capped_end = recorded_end(store, "t2", "r", 1)
    assert capped_end is not None and capped_end.records == 2 and not capped_end.caught_up

    mid = Checkpoint(first[2][0], 0)  # a checkpoint inside the first aggregate resumes with its next user record
    resumed = ShardPlan(shard, StartPosition.after(mid), Caps(3), "t3", "r", 1)
    assert [data for *_, data in _table(list(read_plan(raw, store, stream, resumed)))] == [
        b"agg-1", b"agg-2", b"a-2", b"agg-0", b"agg-1", b"agg-2"]
    after = Prober(raw, stream).probe(shard, StartPosition.after(recorded.end), recorded.iterator)
    assert after.pending  # the two later records: seen from the read's own NextShardIterator
    later = ShardPlan(shard, StartPosition.after(recorded.end), Caps(100), "t", "r", 2, recorded.iterator)
    assert [data for *_, data in _table(list(read_plan(raw, store, stream, later)))] == [b"later-0", b"later-1"]
    tip = recorded_end(store, "t", "r", 2)
    assert tip is not None and tip.iterator is not None
    idle = Prober(raw, stream).probe(shard, StartPosition.after(tip.end or TRIM_HORIZON), tip.iterator)
    assert not idle.pending and not idle.ended and idle.iterator is not None


def _batch(sequences: list[int]) -> pa.RecordBatch:
    records = [{"SequenceNumber": str(sequence), "Data": base64.b64encode(f"r{sequence}".encode()).decode(),
                "PartitionKey": "k", "ApproximateArrivalTimestamp": 1.0} for sequence in sequences]
    return arrow_batch("s", "shardId-0", records, False)


def test_a_read_of_a_recorded_plan_keeps_its_rows_through_the_recorded_end_and_only_if_it_reaches_it() -> None:
    """A read that found its plan's end recorded keeps the rows it read through that end (no second read)."""
    batches = [_batch([10, 20]), _batch([30, 40, 50]), _batch([60])]

    def sequences(kept: list[pa.RecordBatch]) -> list[int]:
        return [int(row["sequence_number"]) for batch in kept for row in batch.to_pylist()]

    inside, reached = through_sequence(batches, 40)
    assert (sequences(inside), reached) == ([10, 20, 30, 40], True)
    at_a_batch_end, reached = through_sequence(batches, 20)
    assert (sequences(at_a_batch_end), reached) == ([10, 20], True)
    assert through_sequence(batches, 70)[1] is False  # the read stopped before the end: it is read from the start
    assert through_sequence(batches, 35)[1] is False  # no such record among them (trimmed?): read from the start
    assert through_sequence([], 10) == ([], False)


def test_a_partition_of_several_shards_reads_each_plan_exactly_in_plan_order(kinesalite: NodeEmulator) -> None:
    stream = unique_app("grouped")
    kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    kinesis.create_stream(StreamName=stream, ShardCount=3)
    wait_for(lambda: kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"]
             == "ACTIVE", 30, "stream active")
    shards = [shard["ShardId"] for shard in kinesis.list_shards(StreamName=stream)["Shards"]]
    for index, shard in enumerate(shards):
        for part in range(3):
            kinesis.put_records(StreamName=stream, Records=[
                {"Data": f"{index}-{part}-{n}".encode(), "PartitionKey": "k",
                 "ExplicitHashKey": _hash_key(kinesis, stream, shard)} for n in range(2)])
    raw = RawKinesis("us-east-1", kinesalite.endpoint_url)
    store = _store()
    plans = tuple(ShardPlan(shard, StartPosition.after(TRIM_HORIZON), Caps(100), f"t{index}", "r", 1)
                  for index, shard in enumerate(shards))
    together = _table(list(read_plans(raw, store, stream, plans)))  # the first read: it records each end
    _put(kinesis, stream, [b"later"] * 3)  # past every recorded end: never read
    alone = [_table(list(read_plan(raw, store, stream, plan))) for plan in plans]
    assert together == [row for rows in alone for row in rows]  # each plan's rows, plan after plan
    assert [data for *_, data in together] == [f"{i}-{p}-{n}".encode() for i in range(3) for p in range(3)
                                               for n in range(2)]

    missing = ShardPlan("shardId-000000000099", StartPosition.after(TRIM_HORIZON), Caps(6), "t9", "r", 1)
    with pytest.raises(ShardNotFound):  # any plan's failure fails the whole partition
        list(read_plans(raw, store, stream, (plans[0], missing)))


def _hash_key(kinesis: Any, stream: str, shard: str) -> str:
    ranges = {item["ShardId"]: item["HashKeyRange"] for item in kinesis.list_shards(StreamName=stream)["Shards"]}
    return str(ranges[shard]["StartingHashKey"])


@pytest.mark.spark
@pytest.mark.slow
def test_recomputed_partitions_write_the_same_rows_and_checkpoints_never_pass_what_was_written(
        spark_stack: SparkStack) -> None:
    stack = spark_stack
    driver = stack.agent("driver-1", caps=Caps(30))
    wait_for(lambda: set(stack.owners().values()) == {"driver-1"} and len(stack.owners()) == 4, 30, "owns 4 shards")
    stack.produce(200, "a")
    written: dict[str, int] = {}  # shard -> greatest sequence number written so far
    violations: list[str] = []
    recomputed: list[int] = []

    def write(df: DataFrame, batch_id: int) -> None:
        checkpoints = stack.checkpoints()
        for shard, checkpoint in checkpoints.items():  # what the lease table holds before this batch is written
            if checkpoint.isdigit() and int(checkpoint) > written.get(shard, -1):
                violations.append(f"batch {batch_id}: {shard} checkpointed at {checkpoint}, written {written}")
        first = sorted(tuple(row) for row in df.select("shard_id", "sequence_number", "data").collect())
        if len(recomputed) < 5:
            stack.produce(20, f"during-{batch_id}")  # new records arrive between the two computations
        time.sleep(0.3)
        second = sorted(tuple(row) for row in df.select("shard_id", "sequence_number", "data").collect())
        if first != second:
            violations.append(f"batch {batch_id}: recomputation read other rows")
        recomputed.append(batch_id)
        stack.sink.writer("driver-1")(df, batch_id)
        for shard, sequence, _ in second:
            written[shard] = max(written.get(shard, -1), int(sequence))

    query = driver.run_query(stack.spark, write, str(stack.tmp / "cp"), processing_time="300 milliseconds")
    wait_for(lambda: len(recomputed) >= 5 and stack.all_delivered(), 120, "five batches, everything written")
    query.stop()
    assert violations == []
    counts = stack.sink.payloads()
    assert set(counts) == set(stack.produced) and max(counts.values()) == 1
