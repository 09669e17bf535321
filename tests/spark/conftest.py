"""Spark test fixtures: one local SparkSession per test session, emulators, and a stack of coordinator + drivers."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agent.spark.driver import SparkAgent, register_source
from agent.spark.offsets import Caps
from examples.local_stack import local_spark
from services.coordinator_service import CoordinatorService
from services.emulators.kinesalite import NodeEmulator
from services.emulators.moto_server import MotoServer
from shared.aws import make_client
from shared.config import Settings, load_settings
from tests.coordinator.conftest import kinesalite  # noqa: F401
from tests.e2e.test_agents_and_coordinator import wait_for
from tests.support.stores import unique_app

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SPARK_STARTED: list[float] = []


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local[2] session for every Spark test (JVM start is the dominant cost)."""
    pytest.importorskip("pyspark.sql")
    SPARK_STARTED.append(time.monotonic())
    session: SparkSession = local_spark("shardherd-tests")
    register_source(session)
    yield session
    session.stop()
    print(f"\nSpark tests wall time (session start to stop): {time.monotonic() - SPARK_STARTED[0]:.1f} s")


@dataclass
class Collector:
    """A test sink: rows written per driver, as (worker, batch, shard, sequence, sub, data, reader pid, partition)."""

    rows: list[tuple[str, int, str, str, int, bytes, int, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def writer(self, worker: str, fail_in_batch: int | None = None) -> Any:
        """A foreachBatch function for `worker`; with `fail_in_batch`, that batch raises after its rows landed."""

        def write(df: DataFrame, batch_id: int) -> None:
            from pyspark.sql import functions as F  # noqa: N812

            rows = df.select("shard_id", "sequence_number", "sub_sequence_number", "data", "reader_pid",
                             F.spark_partition_id().alias("part")).collect()
            with self.lock:
                self.rows.extend((worker, batch_id, row[0], row[1], row[2], bytes(row[3]), row[4], row[5])
                                 for row in rows)
            if batch_id == fail_in_batch and rows:
                raise RuntimeError(f"injected sink failure after batch {batch_id} was written")

        return write

    def payloads(self) -> Counter[bytes]:
        with self.lock:
            return Counter(row[5] for row in self.rows)


class StreamStack:
    """A coordinator (in process, short intervals) and a Kinesis stream; Spark-free, so driver processes share it."""

    def __init__(self, moto: MotoServer, emulator: NodeEmulator, shards: int, tmp: Path) -> None:
        self.app = unique_app("spark")
        self.tmp = tmp
        self.kinesis = make_client("kinesis", "us-east-1", emulator.endpoint_url)
        self.kinesis.create_stream(StreamName=self.app, ShardCount=shards)
        wait_for(lambda: self.status() == "ACTIVE", 30, "stream ACTIVE")
        self.base: dict[str, Any] = dict(
            application_name=self.app, stream_name=self.app, store_backend="dynamodb",
            dynamodb_endpoint_url=moto.endpoint_url, kinesis_endpoint_url=emulator.endpoint_url,
            failover_time_millis=4000, discovery_interval_millis=300, lease_assignment_interval_millis=300,
            shard_sync_interval_millis=1000, leader_lock_lease_duration_millis=2000,
            leader_lock_heartbeat_period_millis=400, graceful_lease_handoff_timeout_millis=10000,
            worker_metrics_reporter_freq_millis=1000, api_port=0, disable_worker_metrics=True,
        )
        self.coordinator = CoordinatorService.build(self.settings("coordinator"))
        self.coordinator.start()
        self.produced: list[bytes] = []
        self.keys: list[tuple[str, str]] = []

    def status(self) -> str:
        status: str = self.kinesis.describe_stream_summary(StreamName=self.app)["StreamDescriptionSummary"][
            "StreamStatus"]
        return status

    def settings(self, worker: str, **overrides: Any) -> Settings:
        return load_settings(**{**self.base, "worker_id": worker, **overrides})

    def produce(self, count: int, prefix: str) -> None:
        """Put `count` records `<prefix>-<i>`; their payloads go to `produced`, their (shard, sequence) to `keys`."""
        payloads = [f"{prefix}-{index}".encode() for index in range(count)]
        for start in range(0, count, 500):
            entries = [{"Data": data, "PartitionKey": f"key-{start + offset}"}
                       for offset, data in enumerate(payloads[start:start + 500])]
            response = self.kinesis.put_records(StreamName=self.app, Records=entries)
            assert response.get("FailedRecordCount", 0) == 0
            self.keys.extend((entry["ShardId"], entry["SequenceNumber"]) for entry in response["Records"])
        self.produced.extend(payloads)

    def owners(self) -> dict[str, str | None]:
        return {lease.lease_key: None if lease.checkpoint_owner else lease.lease_owner
                for lease in self.coordinator.store.scan_leases().leases}

    def checkpoints(self) -> dict[str, str]:
        return {lease.lease_key: str(lease.checkpoint) for lease in self.coordinator.store.scan_leases().leases}

    def close(self) -> None:
        self.coordinator.stop()


class SparkStack(StreamStack):
    """A StreamStack with Spark drivers' agents in this process, sharing the test session's SparkSession."""

    def __init__(self, moto: MotoServer, emulator: NodeEmulator, spark: SparkSession, shards: int,
                 tmp: Path) -> None:
        super().__init__(moto, emulator, shards, tmp)
        self.spark = spark
        self.sink = Collector()
        self.agents: dict[str, SparkAgent] = {}

    def agent(self, worker: str, caps: Caps | None = None, **overrides: Any) -> SparkAgent:
        agent = SparkAgent(self.settings(worker, **overrides), channel=self.tmp / f"channel-{worker}",
                           caps=caps or Caps(200), probe_interval=0.2, min_call_interval=0.05, include_reader=True)
        self.agents[worker] = agent
        return agent.start()

    def all_delivered(self) -> bool:
        return set(self.sink.payloads()) >= set(self.produced)

    def close(self) -> None:
        for agent in self.agents.values():
            agent.stop(drain=False)
        super().close()


@pytest.fixture
def spark_stack(moto_server: MotoServer, kinesalite: NodeEmulator, spark: SparkSession,  # noqa: F811
                tmp_path: Path) -> Iterator[SparkStack]:
    stack = SparkStack(moto_server, kinesalite, spark, 4, tmp_path)
    yield stack
    stack.close()
