"""A local stack for examples and benchmarks: moto server (DynamoDB), kinesalite (Kinesis), an in-process coordinator.

Everything listens on 127.0.0.1 and stops with the context manager.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from types import TracebackType
from typing import Any

from agent.spark.session import local_spark as spark_session
from services.coordinator_service import CoordinatorService
from services.emulators.kinesalite import Kinesalite
from services.emulators.moto_server import MotoServer
from shared.aws import make_client
from shared.config import Settings, load_settings

FAST = dict(failover_time_millis=4000, discovery_interval_millis=300, lease_assignment_interval_millis=300,
            shard_sync_interval_millis=1000, leader_lock_lease_duration_millis=2000,
            leader_lock_heartbeat_period_millis=400, worker_metrics_reporter_freq_millis=1000,
            disable_worker_metrics=True, api_port=0)


def local_spark(app: str, master: str = "local[2]") -> Any:
    """The shared local SparkSession (`agent/spark/session.py`), with the any-credentials the emulators accept."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    return spark_session(app, master)


class LocalStack:
    """Emulators, one stream of `shards` shards, and a coordinator assigning its leases."""

    def __init__(self, app: str, shards: int) -> None:
        self.app = app
        self.shards = shards
        self._exit = ExitStack()

    def __enter__(self) -> LocalStack:
        moto = self._exit.enter_context(MotoServer())
        kinesalite = self._exit.enter_context(Kinesalite(shard_limit=500))
        self.base: dict[str, Any] = dict(application_name=self.app, stream_name=self.app, store_backend="dynamodb",
                                         dynamodb_endpoint_url=moto.endpoint_url,
                                         kinesis_endpoint_url=kinesalite.endpoint_url, **FAST)
        self.kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
        self.kinesis.create_stream(StreamName=self.app, ShardCount=self.shards)
        while self.kinesis.describe_stream_summary(StreamName=self.app)["StreamDescriptionSummary"][
                "StreamStatus"] != "ACTIVE":
            time.sleep(0.1)
        coordinator = CoordinatorService.build(self.settings("coordinator"))
        coordinator.start()
        self._exit.callback(coordinator.stop)
        self.coordinator = coordinator
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._exit.close()

    def settings(self, worker: str) -> Settings:
        """Settings for a process of this application."""
        return load_settings(**{**self.base, "worker_id": worker})

    def produce(self, count: int, size: int = 100) -> int:
        """Put `count` records of `size` bytes (500 per PutRecords); returns the bytes written."""
        for start in range(0, count, 500):
            entries = [{"Data": f"{index:08d}".encode().ljust(size, b"."), "PartitionKey": f"key-{index}"}
                       for index in range(start, min(count, start + 500))]
            response = self.kinesis.put_records(StreamName=self.app, Records=entries)
            if response.get("FailedRecordCount", 0):
                raise RuntimeError(f"{response['FailedRecordCount']} records were not accepted")
        return count * size

    def wait_owned(self, worker: str, timeout: float = 60) -> None:
        """Block until `worker` owns every lease."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            owners = [lease.lease_owner for lease in self.coordinator.store.scan_leases().leases]
            if len(owners) == self.shards and set(owners) == {worker}:
                return
            time.sleep(0.2)
        raise TimeoutError(f"{worker} did not get all {self.shards} leases in {timeout} s")
