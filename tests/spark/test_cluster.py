"""Two shardherd Spark drivers in client mode on a standalone cluster: executors in their own JVMs read the shards,
an executor and a driver die by SIGKILL, and no record is lost.

The cluster (`tests/support/spark_cluster.py`) is a master and two workers on 127.0.0.1 started from the installed
PySpark's jars. Each driver is `python -m tests.spark.driver_process --master spark://...` (a shardherd agent in the
driver, a file sink) with one 512 MiB executor of one core; a producer writes records all along. Phases: A and B
split the shards, and the rows' `reader_pid` shows Python workers under each driver's own executor JVM (a child of a
worker), never the driver; A's executor is killed between a batch's first and second Spark job (the second one reads
the batch again), a worker starts a new one and A goes on (every row A wrote since was read under the new one); B
is killed (driver Python and JVM) between a write and its checkpoint, its executor goes with it, and A resumes B's
shards at their lease checkpoints.

(The file sorts before the other Spark tests, so it runs before the session's own SparkSession starts.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import psutil
import pytest

from shardherd.agent.spark.session import FAST_START_JVM
from tests.spark.driver_process import busy_marker
from tests.support.spark_cluster import StandaloneCluster
from tests.support.spark_drivers import Driver, Fleet, Producer, check_delivery, check_tenures
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SHARDS = 4  # the `fleet` fixture's stream (tests/spark/conftest.py)
CLIENT_CONF = {
    "spark.driver.memory": "512m", "spark.executor.memory": "512m", "spark.executor.cores": "1",
    "spark.cores.max": "1", "spark.executor.extraJavaOptions": FAST_START_JVM,
    # What an executor pod gets from its service account; here the emulators' any-credentials.
    "spark.executorEnv.AWS_ACCESS_KEY_ID": "local", "spark.executorEnv.AWS_SECRET_ACCESS_KEY": "local",
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[StandaloneCluster]:
    pytest.importorskip("pyspark")
    cluster = StandaloneCluster(tmp_path / "cluster", workers=2, cores=2, memory="1g")
    yield cluster
    print(cluster.logs())  # captured: pytest shows it when the test failed
    cluster.stop()


class ClusterDriver:
    """A driver of the fleet in client mode on the cluster; the master knows its application by the app name."""

    def __init__(self, fleet: Fleet, cluster: StandaloneCluster, worker: str, *options: str) -> None:
        self.cluster = cluster
        settings = [arg for key, value in CLIENT_CONF.items() for arg in ("--conf", f"{key}={value}")]
        self.driver: Driver = fleet.start(worker, "--master", cluster.url, *settings, *options)
        self.app_name = f"shardherd-{worker}"  # tests/spark/driver_process.py names its session so

    def executors(self) -> list[psutil.Process]:
        """This application's executor JVMs now."""
        (app_id,) = self.cluster.app_ids(self.app_name)
        return self.cluster.executors(app_id)

    def driver_tree(self) -> set[int]:
        """Pids of the driver process and everything it started (its JVM, the streaming source runner...)."""
        root = psutil.Process(self.driver.process.pid)
        return {root.pid} | {child.pid for child in root.children(recursive=True)}

    def readers_since(self, since: float) -> dict[int, float]:
        """Reader pids of the rows this driver wrote after `since` (unix time), each with its last such write."""
        readers: dict[int, float] = {}
        for row in self.driver.rows():
            if row[6] > since:
                readers[row[7]] = max(row[6], readers.get(row[7], 0.0))
        return readers

    def check_readers(self, since: float) -> set[int]:
        """The executor JVMs whose Python workers read this driver's rows written after `since`: each of them a
        child of a worker and of this application, none of the readers in the driver's own process tree."""
        readers = self.readers_since(since)
        assert readers and not set(readers) & self.driver_tree(), (readers, self.driver_tree())
        live: dict[int, psutil.Process] = {}
        for reader, written in readers.items():
            with contextlib.suppress(psutil.Error):
                if psutil.Process(reader).create_time() <= written:  # the reader itself, not a later process
                    executor = self.cluster.executor_of(reader)  # that was given the same pid
                    if executor is not None:
                        live[reader] = executor
        assert live, f"no reader of {self.driver.worker} is still running: {readers}"
        mine = {executor.pid for executor in self.executors()}
        for reader, executor in live.items():
            assert executor.pid in mine, (reader, executor.pid, executor.cmdline()[-12:], mine)
            assert executor.ppid() in self.cluster.worker_pids(), (executor.pid, executor.ppid())
        return {executor.pid for executor in live.values()}


def test_two_client_mode_drivers_on_a_standalone_cluster_survive_an_executor_kill_and_a_driver_kill(
        cluster: StandaloneCluster, fleet: Fleet) -> None:
    stack = fleet.stack
    began = time.monotonic()
    producer = Producer(stack, seed=16)
    try:
        a = ClusterDriver(fleet, cluster, "driver-a", "--slow-write", "0.5")
        b = ClusterDriver(fleet, cluster, "driver-b", "--slow-write", "0.5")
        for one in (a.driver, b.driver):
            wait_for(partial(fleet.writes_all_it_holds, one, SHARDS // 2), 150,
                     partial(fleet.report, f"{one.worker} holds {SHARDS // 2} shards and wrote rows of them"))
        started = time.monotonic() - began
        a_executors, b_executors = a.check_readers(0), b.check_readers(0)
        assert not a_executors & b_executors

        # SIGKILL of A's executor JVM after a batch's rows were written, before its second job (which reads the
        # batch again) and its checkpoint: a worker starts a new executor (while B is killed below), the batch
        # completes and A goes on.
        wait_for(busy_marker(a.driver.out).exists, 30, "driver-a between a write and its checkpoint")
        (victim,) = a.executors()
        victim.kill()
        executor_killed = time.time()

        # SIGKILL of B (driver Python and JVM) between a write and its checkpoint: A takes B's shards after the
        # failover time and reads that batch again; the cluster removes B's application and its executor.
        b_shards = fleet.held_by("driver-b")
        wait_for(busy_marker(b.driver.out).exists, 30, "driver-b between a write and its checkpoint")
        os.killpg(b.driver.process.pid, signal.SIGKILL)
        driver_killed = time.time()
        b.driver.process.wait(30)
        at_kill = stack.checkpoints()  # nobody else can write them until the failover time passed
        wait_for(lambda: fleet.held_by("driver-a") == set(stack.owners()), 30, "driver-a took driver-b's shards")
        failed_over = time.time() - driver_killed
        wait_for(lambda: not cluster.app_ids(b.app_name) and not b_executors & {
            executor.pid for executor in cluster.executors()}, 60, "the cluster ended driver-b's application")
        producer.stop()
        produced = {(shard, sequence, 0) for shard, sequence in stack.keys}
        wait_for(lambda: fleet.written() >= produced, 90, partial(fleet.report, "every record written"))
        # Every row A wrote since the kill was read by its new executor.
        assert victim.pid not in a.check_readers(executor_killed) and not victim.is_running()
        recovered = min(row[6] for row in a.driver.rows() if row[6] > executor_killed) - executor_killed
    finally:
        producer.stop()
    a.driver.process.send_signal(signal.SIGTERM)
    assert a.driver.process.wait(60) == 0, a.driver.tail()

    dupes = check_delivery(fleet, b.driver, at_kill)
    assert dupes and {shard for shard, _, _ in dupes} <= b_shards  # B was killed after a write, before its checkpoint
    moves = check_tenures(fleet, b.driver, at_kill, max_runs=3)  # maybe A first, then the A/B split, the failover
    assert all(row[7] != row[4] for row in fleet.rows())  # no row was read in a driver process
    assert failed_over < 4.0 + 3.0  # failover time plus a few assignment rounds
    print(f"\nstandalone cluster: {len(produced)} records, {moves} moves between drivers, {len(dupes)} duplicates "
          f"after the driver kill, first write {recovered:.1f} s after the executor kill, driver failover "
          f"{failed_over:.1f} s, drivers reading after {started:.1f} s, wall {time.monotonic() - began:.1f} s")
