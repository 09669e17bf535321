"""The executors' Kinesis client keeps a connection per read thread: a task reading many shards opens no new ones.

Over kinesalite on 127.0.0.1; urllib3's own log says when a connection is opened or dropped from a full pool.
"""

from __future__ import annotations

import pytest

from shardherd.agent.read_spec import StartPosition
from shardherd.agent.spark.arrow_read import read_plans
from shardherd.agent.spark.kinesis_raw import RawKinesis
from shardherd.agent.spark.offsets import Caps, ShardPlan
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import TRIM_HORIZON
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.store import TableNames
from tests.support.stores import unique_app
from tests.support.waiting import wait_for


def test_a_task_of_many_shards_keeps_a_connection_per_shard(
        kinesalite: NodeEmulator, caplog: pytest.LogCaptureFixture) -> None:
    shards = 12  # more than a small pool holds: each read thread must keep its connection between calls
    stream = unique_app("wide")
    kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    kinesis.create_stream(StreamName=stream, ShardCount=shards)
    wait_for(lambda: kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"]
             == "ACTIVE", 30, "stream active")
    try:
        raw = RawKinesis("us-east-1", kinesalite.endpoint_url)
        plans = []
        for item in sorted(kinesis.list_shards(StreamName=stream)["Shards"], key=lambda item: item["ShardId"]):
            shard, hash_key = item["ShardId"], item["HashKeyRange"]["StartingHashKey"]  # a put lands on that shard
            for index in range(3):
                kinesis.put_record(StreamName=stream, Data=f"{shard}-{index}".encode(), PartitionKey="k",
                                   ExplicitHashKey=hash_key)
            plans.append(ShardPlan(shard, StartPosition.after(TRIM_HORIZON), Caps(100), f"t-{shard}", "r", 1))
        store = MemoryLeaseStore(TableNames.for_application("wide"))
        caplog.set_level("DEBUG", logger="urllib3")
        reads = [[row for batch in read_plans(raw, store, stream, tuple(plans))
                  for row in batch.column("data").to_pylist()] for _ in range(3)]
        assert reads[0] == reads[1] == reads[2] and len(reads[0]) == 3 * shards
        assert not [record for record in caplog.records if "pool is full" in record.getMessage()]
        opened = [record for record in caplog.records if record.getMessage().startswith("Starting new HTTP connection")]
        assert len(opened) <= shards  # the second and third reads reuse the first read's connections
    finally:
        kinesis.delete_stream(StreamName=stream)  # the session's emulator counts open shards against its limit
