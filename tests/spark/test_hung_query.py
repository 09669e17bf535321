"""A Spark query stuck inside a batch gives its leases back and ends the driver; a long batch that works does not.

Issue 30: the driver counted a shard whose records wait for the next batch as progressing at every probe round, so a
query stuck in a batch kept its leases (and the driver its health) for good. Now such a lease progresses when the
query does (agent/spark/query_watch.py): triggers completing, and the query's Spark jobs and tasks moving on.
A real local-mode query on kinesalite and moto; the sink first runs small Spark jobs for longer than the give-up bound
(a slow batch that works), then blocks (a write that never returns).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from shardherd.agent.spark.driver import SparkAgent
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import TRIM_HORIZON
from shardherd.shared.config import load_settings
from shardherd.shared.lease import new_lease
from shardherd.shared.supervision import EXIT_GAVE_UP
from tests.support.stores import make_store, unique_app
from tests.support.stream_stack import active_stream
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KEY = "shardId-000000000000"


class Batch:
    """A foreachBatch function: its first batch with rows works in small Spark jobs for `working` s, then blocks."""

    def __init__(self, working: float) -> None:
        self.working = working
        self.entered = threading.Event()
        self.blocked = threading.Event()
        self.release = threading.Event()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        if self.entered.is_set() or df.count() == 0:
            return
        self.entered.set()
        until = time.monotonic() + self.working
        while time.monotonic() < until:  # slow, but every job is progress
            time.sleep(0.5)
            df.sparkSession.range(4).count()
        self.blocked.set()  # right after the last job: the query's last progress
        self.release.wait(60)  # stuck: no job, no task, the trigger never ends


def test_a_query_stuck_in_a_batch_gives_its_lease_back_and_ends_the_driver_a_slow_batch_keeps_it(
        spark: SparkSession, moto_server: MotoServer, kinesalite: NodeEmulator, tmp_path: Path) -> None:
    """About 25 s after Spark's start: the slow batch must outlast the give-up bound (8.4 s at a 2 s failover), then
    the stuck one must reach it too."""
    stream = unique_app("hung-query")
    kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    active_stream(kinesis, stream, 1)
    settings = load_settings(worker_id="w1", application_name=stream, stream_name=stream,
                             kinesis_endpoint_url=kinesalite.endpoint_url,
                             dynamodb_endpoint_url=moto_server.endpoint_url, disable_worker_metrics=True,
                             failover_time_millis=2000, discovery_interval_millis=200, agent_health_port=0)
    store = make_store("dynamodb", moto_url=moto_server.endpoint_url, app=stream)  # executors open it by name
    exits: list[int] = []
    agent = SparkAgent(settings, channel=tmp_path / "channel", store=store, probe_interval=0.2, exit=exits.append)
    bounds = agent.stalls.bounds
    batch = Batch(working=bounds.give_up_after + 1.0)
    try:
        agent.run_query(spark, batch, str(tmp_path / "checkpoint"), processing_time="0.5 seconds")
        assert agent.health is not None
        # Started first: the query's first trigger and the executors' Python workers (seconds each at a load of 50)
        spark.range(2).rdd.map(lambda row: row).count()
        wait_for(lambda: agent.query_watch.started, 120, "the query's first trigger to end")
        agent.query_watch.exit_after = bounds.give_up_after + 1.0  # the exit's floor (30 s) shortened for the test
        kinesis.put_record(StreamName=stream, Data=b"waiting", PartitionKey="k")
        store.create_lease(new_lease(KEY, TRIM_HORIZON))
        store.assign(KEY, "w1", None, None)
        url = f"http://127.0.0.1:{agent.health.port}/healthz"
        wait_for(batch.entered.is_set, 60, "the batch with the waiting record")
        # The batch's first job read the record, starting the executor's Python data-source worker: at these timings
        # (red after 2.3 s) that alone can take longer, so health may be red as the batch begins. From the first small
        # job on, the batch progresses and health must be green throughout.
        wait_for(lambda: httpx.get(url, timeout=5).status_code == 200, bounds.red_after + 1.0,
                 "health green once the batch's small jobs run")
        answers = []
        while not batch.blocked.is_set():  # a slow batch whose jobs complete: green, the lease kept
            answers.append(httpx.get(url, timeout=5).status_code)
            assert KEY in agent.keeper.held() and agent.stalls.given_up == 0 and exits == []
            time.sleep(0.25)
        assert set(answers) == {200}
        stuck = time.monotonic()
        red = wait_for(lambda: httpx.get(url, timeout=5).status_code == 503, bounds.give_up_after, "health red")
        assert KEY in httpx.get(url, timeout=5).json()["detail"]
        wait_for(lambda: agent.stalls.given_up == 1, bounds.give_up_after + 2, "the lease given back")
        given = time.monotonic() - stuck
        wait_for(lambda: exits == [EXIT_GAVE_UP], 5, "the driver to give up")
        ended = time.monotonic() - stuck
        print(f"\nquery stuck: health red after {red:.2f} s, lease given back after {given:.2f} s, driver gave up "
              f"after {ended:.2f} s (bounds {bounds.red_after:.1f} / {bounds.give_up_after:.1f} / "
              f"{agent.query_watch.exit_after:.1f} s)")
        assert bounds.red_after - 0.5 <= red <= bounds.red_after + 1.5
        assert bounds.give_up_after - 0.5 <= given <= bounds.give_up_after + 1.5
        assert "QueryHung" in (agent.supervisor.gave_up or "")
        lease = store.get_lease(KEY)
        assert lease is not None and lease.lease_owner != "w1"
    finally:
        batch.release.set()
        agent.stop(drain=False)
        store.close()
