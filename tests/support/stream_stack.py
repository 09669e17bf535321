"""A coordinator in this process (short intervals) and a Kinesis stream on the session's emulators, for e2e tests."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from shardherd.agent.spark.session import local_spark as spark_session
from shardherd.services.coordinator_service import CoordinatorService
from shardherd.services.emulators.kinesalite import Kinesalite, NodeEmulator
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.config import Settings, load_settings
from tests.support.fast_settings import fast_settings
from tests.support.stores import unique_app
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def active_stream(kinesis: Any, name: str, shards: int) -> None:
    """Create stream `name` with `shards` shards and wait until it is ACTIVE."""
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    wait_for(lambda: kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamStatus"]
             == "ACTIVE", 30, f"stream {name} ACTIVE")


def kill_processes(processes: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGKILL every process still running (a test's own agent subprocesses) and reap it."""
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(10)


class StreamStack:
    """The stream, the coordinator and the settings every worker of one test application shares."""

    def __init__(self, moto: MotoServer, emulator: NodeEmulator | KinesisLimits, shards: int, prefix: str = "e2e",
                 failover_millis: int = 2000, handoff_timeout_millis: int = 5000,
                 extra_streams: tuple[str, ...] = (), **overrides: Any) -> None:
        """`extra_streams` (existing streams) make it a multi-stream application over the app's stream and them."""
        self.app = unique_app(prefix)
        self.kinesis = make_client("kinesis", "us-east-1", emulator.endpoint_url)
        self.kinesis.create_stream(StreamName=self.app, ShardCount=shards)
        wait_for(lambda: self.status() == "ACTIVE", 30, "stream ACTIVE")
        self.base: dict[str, Any] = dict(
            application_name=self.app, stream_name=self.app, store_backend="dynamodb",
            dynamodb_endpoint_url=moto.endpoint_url, kinesis_endpoint_url=emulator.endpoint_url,
            **fast_settings(failover_time_millis=failover_millis,
                            graceful_lease_handoff_timeout_millis=handoff_timeout_millis), api_port=0,
            disable_worker_metrics=True,  # workers share one host here: its CPU says nothing about their load
        )
        if extra_streams:
            self.base.update(stream_name=None, streams=[{"name": name} for name in (self.app, *extra_streams)])
        self.base.update(overrides)
        self.coordinator = CoordinatorService.build(self.settings("coordinator"))
        self.coordinator.start()
        self.produced: list[bytes] = []
        self.keys: list[tuple[str, str]] = []

    def status(self) -> str:
        """The stream's status (ACTIVE once a reshard is done)."""
        status: str = self.kinesis.describe_stream_summary(StreamName=self.app)["StreamDescriptionSummary"][
            "StreamStatus"]
        return status

    def settings(self, worker: str, **overrides: Any) -> Settings:
        """The application's settings for one worker."""
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
        """Owner per lease once settled; None while unassigned or while a handoff is still in progress."""
        return {lease.lease_key: None if lease.checkpoint_owner else lease.lease_owner
                for lease in self.coordinator.store.scan_leases().leases}

    def checkpoints(self) -> dict[str, str]:
        """The stored checkpoint of every lease."""
        return {lease.lease_key: str(lease.checkpoint) for lease in self.coordinator.store.scan_leases().leases}

    def wait_owned(self, worker: str, timeout: float = 60) -> None:
        """Block until `worker` owns every lease of the stream."""
        shards = len(self.kinesis.list_shards(StreamName=self.app)["Shards"])
        wait_for(lambda: list(self.owners().values()) == [worker] * shards, timeout, f"{worker} to own every lease")

    def close(self) -> None:
        """Stop the coordinator (workers are the subclass's business)."""
        self.coordinator.stop()


@contextmanager
def local_stream_stack(prefix: str, shards: int, **overrides: Any) -> Iterator[StreamStack]:
    """A StreamStack on its own moto server and kinesalite, for scripts outside a test session (bench/)."""
    with MotoServer() as moto, Kinesalite(shard_limit=500) as kinesalite:
        stack = StreamStack(moto, kinesalite, shards, prefix, **overrides)
        try:
            yield stack
        finally:
            stack.close()


def local_spark(app: str, master: str = "local[2]", conf: Mapping[str, str] | None = None) -> SparkSession:
    """The local SparkSession of `agent/spark/session.py`, with the any-credentials the emulators accept.

    The Python workers Spark starts inherit this environment, so the data source reads the emulators too.
    """
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    return spark_session(app, master, conf=conf)
