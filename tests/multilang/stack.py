"""A stream on kinesalite, DynamoDB on moto, and `shardherd multilang` processes run as users run them.

Each worker is `python -m shardherd multilang --properties FILE` in its own process group (so a kill takes its
children too), with the test's short intervals as SHARDHERD_* variables; the properties file is written as a
MultiLangDaemon user would write it, pointed at the emulators.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from shardherd.shared.aws import make_client
from tests.kcl.harness import put_payloads
from tests.support.fast_settings import fast_env
from tests.support.file_ledger import LEDGER_ENV, read_ledger
from tests.support.stores import unique_app
from tests.support.waiting import wait_for

REPOSITORY = Path(__file__).resolve().parents[2]
APP = REPOSITORY / "tests" / "multilang" / "kclpy_app.py"


def write_properties(path: Path, **values: str) -> Path:
    """A properties file with `key = value` lines."""
    path.write_text("".join(f"{key} = {value}\n" for key, value in values.items()), encoding="utf-8")
    return path


class MultiLangStack:
    """One application: a stream, its lease tables on moto, and multilang worker processes."""

    def __init__(self, moto_url: str, kinesis_url: str, workdir: Path, shards: int) -> None:
        self.app = unique_app("ml")
        self.workdir = workdir
        self.moto_url = moto_url
        self.kinesis_url = kinesis_url
        self.ledger = workdir / "ledger.txt"
        self.kinesis = make_client("kinesis", "us-east-1", kinesis_url)
        self.dynamodb = make_client("dynamodb", "us-east-1", moto_url)
        self.kinesis.create_stream(StreamName=self.app, ShardCount=shards)
        wait_for(lambda: self.kinesis.describe_stream_summary(StreamName=self.app)["StreamDescriptionSummary"][
            "StreamStatus"] == "ACTIVE", 30, "stream ACTIVE")
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.sequence: dict[str, tuple[str, str]] = {}  # payload -> (shard, sequence number)

    def properties(self, name: str = "app.properties", **extra: str) -> Path:
        """The application's properties file: this repository's kclpy app, pointed at the emulators."""
        values = {
            "executableName": f"{sys.executable} {APP}", "streamName": self.app, "applicationName": self.app,
            "AWSCredentialsProvider": "DefaultCredentialsProvider", "regionName": "us-east-1",
            "kinesisEndpoint": self.kinesis_url, "dynamoDBEndpoint": self.moto_url,
            "initialPositionInStream": "TRIM_HORIZON", "idleTimeBetweenReadsInMillis": "100",
            "failoverTimeMillis": "2000", **extra,
        }
        return write_properties(self.workdir / name, **values)

    def env(self, worker: str, **extra: str) -> dict[str, str]:
        """The environment of a worker process (and so of its children)."""
        return {
            **os.environ, **fast_env(), "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "SHARDHERD_API_PORT": "0", "SHARDHERD_WORKER_ID": worker, LEDGER_ENV: str(self.ledger),
            "PYTHONPATH": str(REPOSITORY), **extra,
        }

    def start(self, worker: str, properties: Path, cwd: Path | None = None, **env: str) -> subprocess.Popen[bytes]:
        """Start `shardherd multilang --properties <file>` as worker `worker`, logging to <workdir>/<worker>.log."""
        log = open(self.workdir / f"{worker}.log", "ab")  # noqa: SIM115 (the child holds it)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "shardherd", "multilang", "--properties", str(properties)],
                env=self.env(worker, **env), cwd=cwd or self.workdir, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        finally:
            log.close()
        self.workers[worker] = process
        return process

    def end(self, worker: str, sig: signal.Signals = signal.SIGTERM) -> int:
        """SIGTERM the worker (it drains: its children get shutdownRequested and checkpoint), or SIGKILL its whole
        process group (the worker and its children: a host dying); its exit code."""
        process = self.workers[worker]
        with contextlib.suppress(ProcessLookupError):
            if sig is signal.SIGKILL:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)
        return process.wait(40)

    def log(self, worker: str) -> str:
        """A worker's log so far."""
        return (self.workdir / f"{worker}.log").read_text(encoding="utf-8", errors="replace")

    def produce(self, count: int, prefix: str) -> list[str]:
        """Put records `<prefix>-<i>` spread over the shards; remember where each landed."""
        return put_payloads(self.kinesis, self.app, count, prefix, self.sequence)

    def delivered(self) -> Counter[str]:
        """How often each payload reached a record processor."""
        return Counter(entry[5] for entry in read_ledger(str(self.ledger)))

    def notes(self) -> list[str]:
        """The processors' notes (initialize, probes, shutdown calls), in order."""
        path = Path(str(self.ledger) + ".notes")
        return path.read_text(encoding="utf-8").splitlines() if path.exists() else []

    def last_sequences(self, payloads: list[str]) -> dict[str, str]:
        """The last sequence number of `payloads` in each shard."""
        last: dict[str, str] = {}
        for data in payloads:
            shard, sequence = self.sequence[data]
            if shard not in last or int(sequence) > int(last[shard]):
                last[shard] = sequence
        return last

    def checkpoints(self) -> dict[str, str]:
        """The stored checkpoint of each lease of the application's table."""
        try:
            items = self.dynamodb.scan(TableName=self.app, ConsistentRead=True)["Items"]
        except self.dynamodb.exceptions.ResourceNotFoundException:
            return {}  # the first worker has not created the table yet
        return {item["leaseKey"]["S"]: item["checkpoint"]["S"] for item in items
                if item["leaseKey"]["S"].startswith("shardId-")}

    def close(self) -> None:
        """Kill every worker still running."""
        for worker, process in self.workers.items():
            if process.poll() is None:
                self.end(worker, signal.SIGKILL)


def all_seen(stack: MultiLangStack, payloads: list[str]) -> bool:
    """True once every payload is in the ledger."""
    seen = stack.delivered()
    return all(data in seen for data in payloads)

