"""A Java KCL + shardherd application on the test emulators: one stream, one KCL lease table, one record ledger.

KCL workers (tests/support/kcl_worker.py) read Kinesis through the h2c proxy; shardherd's coordinator runs in this
process and its agents as `shardherd agent` subprocesses with tests/support/file_ledger.py's processor. Both kinds
of worker append to the same ledger file, one line per delivered record, so a test can tell who read what and when.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from botocore.exceptions import ConnectionClosedError

from shardherd.services.coordinator_service import CoordinatorService
from shardherd.services.emulators.h2c_proxy import H2cProxy
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.config import load_settings
from tests.support.file_ledger import LEDGER_ENV, read_ledger
from tests.support.kcl_worker import KclWorker
from tests.support.stores import unique_app
from tests.support.waiting import wait_for

# shardherd's timings for the interop tests, matched to tests/support/kcl_worker.py's FAST_TIMINGS (KCL's lease
# duration there is 3 s).
SHARDHERD_TIMINGS = {
    "FAILOVER_TIME_MILLIS": "3000",
    "DISCOVERY_INTERVAL_MILLIS": "300",
    "LEASE_ASSIGNMENT_INTERVAL_MILLIS": "500",
    "SHARD_SYNC_INTERVAL_MILLIS": "2000",
    "LEADER_LOCK_LEASE_DURATION_MILLIS": "2000",
    "LEADER_LOCK_HEARTBEAT_PERIOD_MILLIS": "400",
    "GRACEFUL_LEASE_HANDOFF_TIMEOUT_MILLIS": "3000",
    "IN_MEMORY_WORKER_METRICS_CAPTURE_FREQUENCY_MILLIS": "500",
    "WORKER_METRICS_REPORTER_FREQ_MILLIS": "2000",
}


class InteropStack:
    """One application shared by Java KCL workers and shardherd (coordinator in process, agents as processes)."""

    def __init__(self, moto: MotoServer, kinesalite: NodeEmulator, proxy: H2cProxy, workdir: Path, shards: int,
                 liveness: str = "worker") -> None:
        self.app = unique_app("kcl")
        self.moto = moto
        self.proxy = proxy
        self.workdir = workdir
        self.ledger = workdir / "ledger.txt"
        self.kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
        self.dynamodb = make_client("dynamodb", "us-east-1", moto.endpoint_url)
        self.kinesis.create_stream(StreamName=self.app, ShardCount=shards)
        wait_for(lambda: self.kinesis.describe_stream_summary(StreamName=self.app)["StreamDescriptionSummary"][
            "StreamStatus"] == "ACTIVE", 30, "stream ACTIVE")
        self.env = {
            **os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "SHARDHERD_APPLICATION_NAME": self.app, "SHARDHERD_STREAM_NAME": self.app,
            "SHARDHERD_STORE_BACKEND": "dynamodb", "SHARDHERD_DYNAMODB_ENDPOINT_URL": moto.endpoint_url,
            "SHARDHERD_KINESIS_ENDPOINT_URL": kinesalite.endpoint_url, "SHARDHERD_API_PORT": "0",
            "SHARDHERD_LIVENESS_MODE": liveness, LEDGER_ENV: str(self.ledger),
            **{f"SHARDHERD_{name}": value for name, value in SHARDHERD_TIMINGS.items()},
        }
        self.coordinator: CoordinatorService | None = None
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.kcl: dict[str, KclWorker] = {}
        self.produced: list[str] = []
        self.sequence: dict[str, tuple[str, str]] = {}  # payload -> (shard, sequence number)

    # Producing and the ledger.

    def produce(self, count: int, prefix: str) -> None:
        """Put `count` records `<prefix>-<i>` spread over every shard; remember where each one landed."""
        self.produced.extend(put_payloads(self.kinesis, self.app, count, prefix, self.sequence))

    @contextlib.contextmanager
    def steady_load(self, prefix: str, per_second: int = 100) -> Iterator[None]:
        """Produce about `per_second` records a second (`<prefix><batch>-<i>`) until the block ends.

        KCL balances a fleet by each lease's throughput: on an idle stream every figure is 0 and it never moves a lease.
        """
        stop = threading.Event()

        def run() -> None:
            batch = 0
            while not stop.wait(0.5):
                self.produce(per_second // 2, f"{prefix}{batch}")
                batch += 1

        thread = threading.Thread(target=run, name="steady-load", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(10)

    def entries(self) -> list[tuple[str, str, int, str, float, str]]:
        """Every ledger line so far: (shard, sequence, sub-sequence, worker, time, data)."""
        return read_ledger(str(self.ledger))

    def delivered(self) -> Counter[str]:
        """How often each payload reached a record processor."""
        return Counter(entry[5] for entry in self.entries())

    def all_delivered(self, prefix: str = "") -> bool:
        """True once every produced record (starting with `prefix`) is in the ledger."""
        seen = self.delivered()
        return all(data in seen for data in self.produced if data.startswith(prefix))

    # The lease table, read raw (what any KCL or shardherd worker would see).

    def leases(self) -> dict[str, dict[str, Any]]:
        """Every lease item of the application's table (items whose key is a shard id), by lease key."""
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"TableName": self.app, "ConsistentRead": True}
        while True:
            page = self.dynamodb.scan(**kwargs)
            items.extend(page["Items"])
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return {item["leaseKey"]["S"]: item for item in items if item["leaseKey"]["S"].startswith("shardId-")}

    def owners(self) -> dict[str, str | None]:
        """The settled owner of each lease (None while unowned or in a handoff)."""
        return {key: None if "checkpointOwner" in item else item.get("leaseOwner", {}).get("S")
                for key, item in self.leases().items()}

    def leader(self) -> str | None:
        """The owner named by the `Leader` lock item in `<app>-CoordinatorState`, None when there is no item."""
        item = self.dynamodb.get_item(TableName=f"{self.app}-CoordinatorState", Key={"key": {"S": "Leader"}},
                                      ConsistentRead=True).get("Item")
        return None if item is None else str(item["ownerName"]["S"])

    def checkpoints(self) -> dict[str, str]:
        """The stored checkpoint of each lease."""
        return {key: item["checkpoint"]["S"] for key, item in self.leases().items()}

    # KCL workers.

    def start_kcl(self, worker: str) -> KclWorker:
        """Start a Java KCL MultiLangDaemon worker on this application."""
        process = KclWorker(self.workdir, worker, self.app, self.app, self.proxy.endpoint_url, self.moto.endpoint_url,
                            self.ledger).start()
        self.kcl[worker] = process
        return process

    # shardherd.

    def start_coordinator(self) -> CoordinatorService:
        """Start a shardherd coordinator replica in this process."""
        settings = load_settings(**{key[len("SHARDHERD_"):].lower(): value for key, value in self.env.items()
                                    if key.startswith("SHARDHERD_") and key != LEDGER_ENV},
                                 worker_id="coordinator")
        self.coordinator = CoordinatorService.build(settings)
        self.coordinator.start()
        return self.coordinator

    def stop_coordinator(self) -> None:
        """Stop the coordinator (it releases the leader lock at once)."""
        if self.coordinator is not None:
            self.coordinator.stop()
            self.coordinator = None

    def start_agent(self, worker: str) -> subprocess.Popen[bytes]:
        """Start a `shardherd agent` process (CPU metrics on, as users run it) writing to the ledger."""
        log = open(self.workdir / f"{worker}.log", "ab")  # noqa: SIM115 (the child holds it; closed on exit)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "shardherd", "agent", "--processor",
                 "tests.support.file_ledger:FileLedgerProcessor"],
                env={**self.env, "SHARDHERD_WORKER_ID": worker}, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        self.agents[worker] = process
        return process

    def stop_agent(self, worker: str, timeout: float = 30.0) -> int:
        """SIGTERM an agent (it drains: checkpoints and gives its leases back) and wait for it."""
        process = self.agents[worker]
        process.send_signal(signal.SIGTERM)
        return process.wait(timeout)

    def kill_agent(self, worker: str) -> None:
        """SIGKILL an agent: no drain, no checkpoint."""
        process = self.agents[worker]
        process.kill()
        process.wait(10)

    def close(self) -> None:
        """Stop everything this stack started."""
        for worker in self.kcl.values():
            worker.kill()
        for process in self.agents.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
        self.stop_coordinator()


def put_payloads(kinesis: Any, stream: str, count: int, prefix: str,
                 sequence: dict[str, tuple[str, str]]) -> list[str]:
    """Put records `<prefix>-<i>` (also their partition keys) into `stream`; note each one's (shard, sequence)."""
    payloads = [f"{prefix}-{index}" for index in range(count)]
    for start in range(0, count, 500):
        batch = payloads[start:start + 500]
        response = _put_records(kinesis, stream, batch)
        assert response.get("FailedRecordCount", 0) == 0
        for data, entry in zip(batch, response["Records"], strict=True):
            sequence[data] = (entry["ShardId"], entry["SequenceNumber"])
    return payloads


def _put_records(kinesis: Any, stream: str, batch: list[str]) -> Any:
    """PutRecords of `batch`, once more if the pooled connection was reset before any answer.

    The stack's clients make one attempt per call (shared/aws.py; the product retries itself), and kinesalite closes
    a keep-alive connection after 5 s idle: a put reusing it just then gets ECONNRESET before the emulator read the
    request (CI saw it once between two phases of tests/multilang/test_kclpy_app.py). A put that did land and is
    sent again would show as a record delivered twice, which the tests assert against.
    """
    records = [{"Data": data.encode(), "PartitionKey": data} for data in batch]
    try:
        return kinesis.put_records(StreamName=stream, Records=records)
    except ConnectionClosedError:
        return kinesis.put_records(StreamName=stream, Records=records)


def first_sequence_after(sequences: list[str], checkpoint: str) -> str | None:
    """The smallest of `sequences` above `checkpoint` (a sequence number or a TRIM_HORIZON-like sentinel)."""
    later = [s for s in sequences if not checkpoint.isdigit() or int(s) > int(checkpoint)]
    return min(later, key=int) if later else None


def timed(label: str, started: float, figures: dict[str, float]) -> None:
    """Record the seconds since `started` under `label`."""
    figures[label] = round(time.monotonic() - started, 1)
