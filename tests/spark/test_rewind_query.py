"""A rewind under a running Spark query (decision 0031): the driver stops its plans, the rewritten checkpoints are
where its next plans start, and every record after the time is written once more, none before it, none lost.

About 80 s at load 14-30 (a query's start, three waits for the sink, the rewind's stop, rewrite and resume on one
driver): the only test of a rewind under a real Spark query; the live stack's `scenario rewind` is the other proof.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from shardherd.agent.spark.offsets import Caps
from shardherd.coordinator.assignment_feed import NEWS
from shardherd.coordinator.rewind import Rewinder, RewindRequest
from tests.spark.conftest import SparkStack
from tests.support.waiting import wait_for


def test_a_rewind_under_a_running_query_writes_the_records_after_the_time_once_more(spark_stack: SparkStack) -> None:
    stack = spark_stack
    driver = stack.agent("driver-1", caps=Caps(50))
    wait_for(lambda: set(stack.owners().values()) == {"driver-1"}, 30, "driver-1 owns every shard")
    query = driver.run_query(stack.spark, stack.sink.writer("driver-1"), str(stack.tmp / "cp"),
                             processing_time="300 milliseconds")
    try:
        stack.produce(40, "before")
        wait_for(stack.all_delivered, 90, "the records before the time written")
        time.sleep(1.0)  # Kinesis arrival times are in milliseconds: the time falls between the two sets
        to = datetime.now(UTC)
        time.sleep(1.0)
        stack.produce(40, "after")
        wait_for(stack.all_delivered, 60, "the records after the time written")

        coordinator = stack.coordinator
        record = Rewinder(coordinator.store, stack.kinesis, stack.settings("operator"), coordinator.clock,
                          lambda worker: coordinator.loop.feed.signal(worker, NEWS)).run(
            RewindRequest(who="test", to=to.isoformat()))
        assert record.outcome == "done", record
        assert len(record.rows) == 4, record.rows

        after = [data for data in stack.produced if data.startswith(b"after")]
        wait_for(lambda: all(stack.sink.payloads()[data] == 2 for data in after), 60,
                 "every record after the time written once more")
        stack.produce(20, "later")
        wait_for(stack.all_delivered, 60, "the records produced after the rewind written")
        time.sleep(1.5)  # a stale plan's batch, if any, would land now
    finally:
        query.stop()
    counts = stack.sink.payloads()
    assert {counts[data] for data in stack.produced if data.startswith(b"before")} == {1}  # none before the time
    assert {counts[data] for data in after} == {2}  # each once more, none three times
    assert {counts[data] for data in stack.produced if data.startswith(b"later")} == {1}
    assert not any(lease.is_paused for lease in coordinator.store.scan_leases().leases)  # resumed
