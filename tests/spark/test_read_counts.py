"""A Spark driver's shard counters: the executors' reads and the driver's probes count calls and throttles per shard.

Through the limits proxy (services/emulators/limits_proxy.py) with one GetRecords call per shard per second, so a
second call at once is throttled and retried after a jittered wait; no Spark session (the read and probe functions
the executors and the driver call).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from shardherd.agent.read_spec import StartPosition
from shardherd.agent.reader import ReaderStats
from shardherd.agent.spark.arrow_read import read_plans
from shardherd.agent.spark.batch_ends import recorded_end
from shardherd.agent.spark.kinesis_raw import RawKinesis
from shardherd.agent.spark.offsets import Caps, ShardPlan
from shardherd.agent.spark.probe import Prober
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.throttle_model import ShardLimits
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import TRIM_HORIZON
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.store import StateCondition, StateValue, TableNames
from tests.support.stores import unique_app
from tests.support.waiting import wait_for


class CountingStore(MemoryLeaseStore):
    """A memory store counting the coordinator-state reads and writes (where executors record batch ends)."""

    def __init__(self) -> None:
        super().__init__(TableNames.for_application("counts"))
        self.state_calls: list[str] = []

    def get_state(self, key: str, consistent: bool = True) -> dict[str, StateValue] | None:
        self.state_calls.append("get")
        return super().get_state(key, consistent)

    def put_state(self, key: str, attributes: Mapping[str, StateValue],
                  condition: StateCondition | None = None) -> bool:
        self.state_calls.append("put")
        return super().put_state(key, attributes, condition)


PROBE_SECONDS = 20.0  # how long the test probes again until a probe is answered


def test_a_read_records_its_calls_and_throttles_with_its_end_and_a_probe_counts_into_the_shards_stats(
        kinesalite: NodeEmulator) -> None:
    """About 1-3 s: the throttled calls wait a jittered backoff before they are made again."""
    stream = unique_app("counts")
    with KinesisLimits(kinesalite.port, limits=ShardLimits(read_calls_per_second=1)) as limits:
        kinesis = make_client("kinesis", "us-east-1", limits.endpoint_url)
        kinesis.create_stream(StreamName=stream, ShardCount=1)
        wait_for(lambda: kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"][
            "StreamStatus"] == "ACTIVE", 30, "stream active")
        try:
            for index in range(3):
                kinesis.put_record(StreamName=stream, Data=f"r-{index}".encode(), PartitionKey="k")
            shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
            raw = RawKinesis("us-east-1", limits.endpoint_url)
            store = CountingStore()
            plan = ShardPlan(shard, StartPosition.after(TRIM_HORIZON), Caps(100), "t-1", "r", 1)
            rows = [row for batch in read_plans(raw, store, stream, (plan,))
                    for row in batch.column("data").to_pylist()]
            stats = ReaderStats()
            prober, deadline = Prober(raw, stream), time.monotonic() + PROBE_SECONDS
            # At once: throttled. A probe that got no answer is failed and the driver probes again after a backoff
            # (on a loaded host every retry of the first probe can land inside the throttled window).
            while prober.probe(shard, StartPosition.after(TRIM_HORIZON), None, stats).failed:
                assert time.monotonic() < deadline, stats
                time.sleep(1.0)
            counted = limits.counts()["shards"][f"{stream}/{shard}"]
        finally:
            kinesis.delete_stream(StreamName=stream)
    assert len(rows) == 3
    assert store.state_calls == ["get", "put"]  # a first read: is an end recorded, then record its own
    end = recorded_end(store, "t-1", "r", 1)
    assert end is not None and end.calls >= 1
    assert stats.get_records_calls == 1 and stats.iterators_requested >= 1 and stats.throttled >= 1
    assert end.calls + stats.get_records_calls == counted["GetRecords.Success"]  # every answered call, once
    assert end.throttled + stats.throttled == counted["ReadProvisionedThroughputExceeded"]
