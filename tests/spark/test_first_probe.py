"""A shard the driver's agent just acquired is in the very next plan: probed at once, and the plan waits for it.

No JVM: the agent's listener side on kinesalite and a real store (moto over HTTP), and the source's planning called as
Spark's runner process calls it. Planned before its first probe, a shard handed to a running driver waited for the
whole next micro-batch (1-2 s of a drain's gap under load); planned while its previous owner was still finishing, it
waited for the next trigger.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from shardherd.agent.spark.driver import SparkAgent
from shardherd.agent.spark.offsets import BatchOffset
from shardherd.agent.spark.source import ShardherdStreamReader, SourceOptions
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import TRIM_HORIZON, Checkpoint
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from shardherd.shared.lease import Lease, new_lease
from tests.support.stores import make_store, unique_app
from tests.support.waiting import wait_for

SHARD = "shardId-000000000000"


@pytest.mark.slow
def test_a_shard_just_acquired_is_in_the_next_plan(kinesalite: NodeEmulator, moto_server: MotoServer,
                                                    tmp_path: Path) -> None:
    kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    stream = unique_app("first-probe")
    kinesis.create_stream(StreamName=stream, ShardCount=1)
    wait_for(lambda: kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"]
             == "ACTIVE", 30, "stream active")
    kinesis.put_records(StreamName=stream, Records=[{"Data": f"r-{i}".encode(), "PartitionKey": "k"}
                                                    for i in range(5)])
    settings = load_settings(worker_id="w1", application_name=stream, stream_name=stream,
                             kinesis_endpoint_url=kinesalite.endpoint_url, disable_worker_metrics=True)
    store = make_store("dynamodb", moto_url=moto_server.endpoint_url)
    agent = SparkAgent(settings, channel=tmp_path, store=store, clock=ManualClock())  # not started: no probe rounds
    try:
        reader = ShardherdStreamReader(SourceOptions.parse(agent.source_options()))
        limit = reader.getDefaultReadLimit()
        start = reader.latestOffset(BatchOffset().to_json(), limit)  # nothing held yet: no batch
        agent.lease_acquired(Lease(SHARD, lease_owner="w1", checkpoint=TRIM_HORIZON))  # what the keeper calls
        planned = BatchOffset.from_json(reader.latestOffset(start, limit))
        assert set(planned.shards) == {SHARD} and planned.shards[SHARD].iterator is not None  # the probe's
    finally:
        agent.stop(drain=False)
        store.close()


@pytest.mark.slow
def test_a_lease_on_its_way_is_in_the_plan_made_while_its_previous_owner_finishes(
        kinesalite: NodeEmulator, moto_server: MotoServer, tmp_path: Path) -> None:
    kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    stream = unique_app("incoming")
    kinesis.create_stream(StreamName=stream, ShardCount=1)
    wait_for(lambda: kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"]
             == "ACTIVE", 30, "stream active")
    put = kinesis.put_records(StreamName=stream, Records=[{"Data": f"r-{i}".encode(), "PartitionKey": "k"}
                                                          for i in range(5)])
    final = Checkpoint.at(put["Records"][1]["SequenceNumber"])  # the previous owner wrote two records
    settings = load_settings(worker_id="w1", application_name=stream, stream_name=stream,
                             kinesis_endpoint_url=kinesalite.endpoint_url, disable_worker_metrics=True)
    store = make_store("dynamodb", moto_url=moto_server.endpoint_url)
    clock = ManualClock()
    agent = SparkAgent(settings, channel=tmp_path, store=store, clock=clock)  # not started: ticks are the test's
    try:
        store.create_lease(new_lease(SHARD, TRIM_HORIZON))
        assert store.assign(SHARD, "w0", None, None).applied
        assert store.start_handoff(SHARD, "w1", "w0").applied  # w0 is finishing its last write
        agent.keeper.tick()
        assert agent.keeper.held() == {} and agent.book.snapshot().incoming == {SHARD}

        def previous_owner_finishes() -> None:
            time.sleep(0.3)
            assert store.checkpoint(SHARD, "w0", final, hand_over=True).applied
            clock.advance(0.5)
            agent.keeper.tick()  # the new owner's next look at the lease it waits for

        finishing = threading.Thread(target=previous_owner_finishes)
        reader = ShardherdStreamReader(SourceOptions.parse(agent.source_options()))
        finishing.start()
        planned = BatchOffset.from_json(reader.latestOffset(BatchOffset().to_json(), reader.getDefaultReadLimit()))
        finishing.join(10)
        assert set(agent.keeper.held()) == {SHARD}
        assert set(planned.shards) == {SHARD}  # this plan, not the next trigger's
        assert planned.shards[SHARD].position.checkpoint == final and planned.shards[SHARD].iterator is not None
    finally:
        agent.stop(drain=False)
        store.close()
