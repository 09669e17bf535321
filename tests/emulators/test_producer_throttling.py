"""The stack's producer over the limits proxy: throttled records are backed off, counted per shard, never dropped."""

from __future__ import annotations

import random
import time

from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.throttle_model import ShardLimits
from shardherd.services.local_stack.producer import Producer, ZipfKeys
from shardherd.shared.aws import make_client
from tests.support.stores import unique_app
from tests.support.stream_stack import active_stream


def test_a_producer_over_the_write_limit_backs_off_and_loses_nothing(kinesalite: NodeEmulator) -> None:
    """About 3 s: 2 s of producing at three times the shard's write limit (shrunk to 200 records/s: a 2-core CI
    machine's kinesalite does not take 1,000 records/s from one producer thread)."""
    with KinesisLimits(kinesalite.port, limits=ShardLimits(write_records_per_second=200)) as limits:
        kinesis = make_client("kinesis", "us-east-1", limits.endpoint_url)
        stream = unique_app("produce")
        active_stream(kinesis, stream, 1)
        rng = random.Random(3)
        producer = Producer(kinesis, stream, 600.0, 0.0, ZipfKeys(50, 1.0, rng), rng).start()
        time.sleep(2.0)
        producer.stop()
        counts = limits.counts()["shards"][f"{stream}/shardId-000000000000"]
    stats = producer.stats
    assert stats.throttled > 0 and stats.throttled_by_shard == {"shardId-000000000000": stats.throttled}
    assert counts["WriteProvisionedThroughputExceeded"] == stats.throttled
    assert counts["IncomingRecords"] == stats.kinesis_records == stats.user_records
    assert stats.kinesis_records + producer.pending == stats.made_records  # nothing dropped: written or held
    assert producer.pending > 0  # the producer made more than the shard took
    assert stats.kinesis_records <= 200 * 3  # within the shard's 200 records/s (2 s, plus the start-up)
