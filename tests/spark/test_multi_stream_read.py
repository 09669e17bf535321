"""The Spark source's executor reads and probes in a multi-stream application, on kinesalite.

Two streams have the same shard ids; the source plans each under its multi-stream lease key, so probes and reads go
to the right stream and every row carries its stream's name.
"""

from __future__ import annotations

import pytest

from shardherd.agent.read_spec import StartPosition
from shardherd.agent.spark.arrow_read import read_plan
from shardherd.agent.spark.book import source_key
from shardherd.agent.spark.kinesis_raw import RawKinesis
from shardherd.agent.spark.offsets import Caps, ShardPlan
from shardherd.agent.spark.probe import Prober
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import TRIM_HORIZON
from shardherd.shared.lease import Lease
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.store import TableNames
from shardherd.shared.streams import StreamIdentifier, read_target
from tests.support.stores import unique_app
from tests.support.waiting import wait_for


def test_source_keys_name_stream_and_shard() -> None:
    stream = StreamIdentifier("123456789012", "orders", 1700000000)
    multi = Lease(lease_key=stream.lease_key("shardId-000000000001"), stream_name=stream.serialized,
                  shard_id="shardId-000000000001")
    assert source_key(multi) == multi.lease_key
    assert read_target(source_key(multi), "") == ("orders", "shardId-000000000001")
    single = Lease(lease_key="shardId-000000000001")
    assert source_key(single) == "shardId-000000000001"
    assert read_target(source_key(single), "clicks") == ("clicks", "shardId-000000000001")


@pytest.mark.slow
def test_probes_and_reads_follow_the_stream_in_the_key(kinesalite: NodeEmulator) -> None:
    kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    names = [unique_app("read-a"), unique_app("read-b")]
    for name in names:
        kinesis.create_stream(StreamName=name, ShardCount=1)
    wait_for(lambda: all(kinesis.describe_stream_summary(StreamName=n)["StreamDescriptionSummary"]["StreamStatus"]
                         == "ACTIVE" for n in names), 30, "streams active")
    for name in names:
        kinesis.put_records(StreamName=name, Records=[{"Data": f"{name}-{i}".encode(), "PartitionKey": "k"}
                                                      for i in range(3)])
    raw = RawKinesis("us-east-1", kinesalite.endpoint_url)
    prober = Prober(raw, ",".join(names))
    for name in names:
        key = StreamIdentifier("000000000000", name, 1).lease_key("shardId-000000000000")
        probe = prober.probe(key, StartPosition.after(TRIM_HORIZON), None)
        assert probe.pending
        plan = ShardPlan(key, StartPosition.after(TRIM_HORIZON), Caps(100), f"t-{name}", "r", 1, probe.iterator)
        store = MemoryLeaseStore(TableNames.for_application("multi"))
        rows = [row for batch in read_plan(raw, store, ",".join(names), plan) for row in batch.to_pylist()]
        assert [(row["stream_name"], row["shard_id"], row["data"]) for row in rows] == [
            (name, "shardId-000000000000", f"{name}-{i}".encode()) for i in range(3)]
