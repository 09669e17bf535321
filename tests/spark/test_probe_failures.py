"""A driver whose probes of a shard are throttled: a failed read (red and given back at a plain agent's bounds), and
the shard's probes back off.

No JVM: the driver's agent (not started: its probe rounds are the test's, on a manual clock) on kinesalite behind the
Kinesis limits proxy, a real store (moto over HTTP). Another consumer spends the shard's read budget for the test's
length (the limits shrunk to 1 byte/s over 600 s: one read of a few records spends it), so every probe is throttled.
Before, a throttled probe was a slow read: no report, given back only after red plus 3 failover times, and probed
again every round.
"""

from __future__ import annotations

from pathlib import Path

from shardherd.agent.spark.driver import SparkAgent
from shardherd.agent.stall_watch import Verdict
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.services.emulators.throttle_model import ITERATOR_THROTTLED, READ_THROTTLED, ShardLimits
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import TRIM_HORIZON
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from shardherd.shared.lease import new_lease
from tests.support.stores import make_store, unique_app
from tests.support.waiting import wait_for

SHARD = "shardId-000000000000"
ROUND = 0.5  # the driver's default probe period, also the backoff's first step


def _throttled(limits: KinesisLimits, stream: str) -> int:
    """Calls the proxy throttled on the stream's shard: each probe's GetRecords, or its GetShardIterator (the rounds
    run back to back in real time, so a probe without an iterator can meet that call's own limit first)."""
    counts = limits.counts()["shards"].get(f"{stream}/{SHARD}", {})
    return int(counts.get(READ_THROTTLED, 0)) + int(counts.get(ITERATOR_THROTTLED, 0))


def test_a_throttled_shard_is_a_failing_lease_given_back_at_red_and_its_probes_back_off(
        kinesalite: NodeEmulator, moto_server: MotoServer, tmp_path: Path) -> None:
    """About 5 s: the limits proxy, a stream and the store start; 20 probe rounds run on the manual clock."""
    spent = ShardLimits(read_bytes_per_second=1, read_bytes_window=600.0)
    with KinesisLimits(kinesalite.port, limits=spent) as limits:
        kinesis = make_client("kinesis", "us-east-1", limits.endpoint_url)
        stream = unique_app("throttled-probe")
        kinesis.create_stream(StreamName=stream, ShardCount=1)
        wait_for(lambda: kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"][
            "StreamStatus"] == "ACTIVE", 30, "stream active")
        kinesis.put_records(StreamName=stream, Records=[{"Data": bytes(100), "PartitionKey": "k"} for _ in range(10)])
        iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=SHARD, ShardIteratorType="TRIM_HORIZON")[
            "ShardIterator"]
        assert len(kinesis.get_records(ShardIterator=iterator)["Records"]) == 10  # the other consumer's read
        settings = load_settings(worker_id="w1", application_name=stream, stream_name=stream,
                                 kinesis_endpoint_url=limits.endpoint_url, disable_worker_metrics=True)
        store = make_store("dynamodb", moto_url=moto_server.endpoint_url)
        clock = ManualClock()
        agent = SparkAgent(settings, channel=tmp_path, store=store, clock=clock, probe_interval=ROUND)
        try:
            store.create_lease(new_lease(SHARD, TRIM_HORIZON))
            assert store.assign(SHARD, "w1", None, None).applied
            agent.keeper.tick()  # acquired: probed at once, throttled
            agent.stalls.check()  # the lease's stall clock starts now
            wait_for(lambda: _throttled(limits, stream) == 1, 10, "the first probe throttled")
            for _ in range(20):
                clock.advance(ROUND)
                agent.probe_round()
            probes = _throttled(limits, stream)
            clock.advance(agent.stalls.bounds.red_after)
            (stalled,) = agent.stalls.stalled()
            agent.stalls.check()
            lease = store.get_lease(SHARD)
        finally:
            agent.stop(drain=False)
            store.close()
    # Waits of [1/2, 1] x 0.5, 1, 2, 4, 5 s from the first probe: 5 to 7 probes in 10 s, not one a round (21).
    assert 5 <= probes <= 7
    assert stalled.verdict is Verdict.GIVE_UP and "ProvisionedThroughputExceeded" in (stalled.failure or "")
    assert lease is not None and lease.lease_owner is None and agent.stalls.given_up == 1
