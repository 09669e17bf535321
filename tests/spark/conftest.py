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

from shardherd.agent.spark.driver import SparkAgent, register_source
from shardherd.agent.spark.offsets import Caps
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from tests.coordinator.conftest import kinesalite  # noqa: F401
from tests.support.spark_drivers import Fleet
from tests.support.stream_stack import StreamStack, local_spark

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


class SparkStack(StreamStack):
    """A StreamStack with Spark drivers' agents in this process, sharing the test session's SparkSession.

    Lease counts (not throughput) decide the split, so a second driver gets exactly half the shards: with the
    default strategy the split follows each shard's measured throughput, which varies with batch timing under load
    (a second driver of 4 shards may get 1 or 3: the likely cause of a handoff test once waiting 60 s in vain for
    two shards to reach driver-2 in a loaded full run).
    """

    def __init__(self, moto: MotoServer, emulator: NodeEmulator, spark: SparkSession, shards: int,
                 tmp: Path, extra_streams: tuple[str, ...] = ()) -> None:
        super().__init__(moto, emulator, shards, prefix="spark", failover_millis=4000, handoff_timeout_millis=10000,
                         extra_streams=extra_streams, lease_assignment_strategy="lease-count")
        self.tmp = tmp
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


@pytest.fixture
def fleet(moto_server: MotoServer, kinesalite: NodeEmulator, tmp_path: Path) -> Iterator[Fleet]:  # noqa: F811
    """Driver processes on a 4-shard stream; lease counts (not throughput) decide the split, so two drivers get 2
    and 2."""
    stack = StreamStack(moto_server, kinesalite, 4, prefix="spark", failover_millis=4000,
                        handoff_timeout_millis=10000, lease_assignment_strategy="lease-count")
    fleet = Fleet(stack, tmp_path)
    yield fleet
    fleet.close()
    stack.close()
