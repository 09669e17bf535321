"""Agent processes (`shardherd agent`) killed and restarted against a coordinator, on moto server and kinesalite.

CPU metrics are on, as users run them (each agent process reads its own driven cgroup tree or ECS metadata endpoint,
tests/support/cpu_fixtures.py), except in the SIGTERM test, which keeps one run with metrics off.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardherd.services.coordinator_service import CoordinatorService
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.config import load_settings
from shardherd.shared.worker import CPU_METRIC
from tests.support.cpu_fixtures import CpuFleet
from tests.support.fast_settings import fast_env
from tests.support.file_ledger import LEDGER_ENV, read_ledger
from tests.support.stores import unique_app, worker_record
from tests.support.stream_stack import kill_processes
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


class ProcessStack:
    """An in-process coordinator plus agent subprocesses writing one ledger file."""

    def __init__(self, moto: MotoServer, kinesalite: NodeEmulator, ledger: Path, metrics: bool = True) -> None:
        self.app = unique_app("proc-e2e")
        self.ledger = str(ledger)
        self.kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
        self.kinesis.create_stream(StreamName=self.app, ShardCount=3)
        wait_for(lambda: self.kinesis.describe_stream_summary(StreamName=self.app)["StreamDescriptionSummary"][
            "StreamStatus"] == "ACTIVE", 30, "stream ACTIVE")
        self.env = {
            **os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "SHARDHERD_APPLICATION_NAME": self.app, "SHARDHERD_STREAM_NAME": self.app,
            "SHARDHERD_STORE_BACKEND": "dynamodb", "SHARDHERD_DYNAMODB_ENDPOINT_URL": moto.endpoint_url,
            "SHARDHERD_KINESIS_ENDPOINT_URL": kinesalite.endpoint_url, LEDGER_ENV: self.ledger,
            **fast_env(disable_worker_metrics=not metrics, api_port=0),
        }
        settings = load_settings(**{key[len("SHARDHERD_"):].lower(): value for key, value in self.env.items()
                                    if key.startswith("SHARDHERD_") and key != LEDGER_ENV},
                                 worker_id="coordinator")
        self.coordinator = CoordinatorService.build(settings)
        self.coordinator.start()
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.produced: list[str] = []
        self.cpu = CpuFleet(ledger.parent / "cpu", holders=lambda: self.owners().values()) if metrics else None

    def start_agent(self, worker: str, processor: str = "tests.support.file_ledger:FileLedgerProcessor",
                    **env: str) -> subprocess.Popen[bytes]:
        cpu = self.cpu.add(worker).settings() if self.cpu is not None else {}
        process = subprocess.Popen(
            [sys.executable, "-m", "shardherd", "agent", "--processor", processor],
            env={**self.env, **cpu, "SHARDHERD_WORKER_ID": worker, **env}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        self.agents[worker] = process
        return process

    def produce(self, count: int, prefix: str) -> None:
        payloads = [f"{prefix}-{index}" for index in range(count)]
        entries = [{"Data": data.encode(), "PartitionKey": data} for data in payloads]
        for start in range(0, count, 500):
            assert self.kinesis.put_records(StreamName=self.app, Records=entries[start:start + 500]).get(
                "FailedRecordCount", 0) == 0
        self.produced.extend(payloads)

    def delivered(self) -> Counter[str]:
        return Counter(entry[5] for entry in read_ledger(self.ledger))

    def all_delivered(self) -> bool:
        return set(self.delivered()) >= set(self.produced)

    def owners(self) -> dict[str, str | None]:
        return {lease.lease_key: None if lease.checkpoint_owner else lease.lease_owner
                for lease in self.coordinator.store.scan_leases().leases}

    def cpu_reported(self, worker: str) -> tuple[float, ...]:
        record = worker_record(self.coordinator.store, worker)
        return () if record is None else tuple(record.metric_stats.get(CPU_METRIC, ()))

    def close(self) -> None:
        kill_processes(self.agents.values())
        self.coordinator.stop()
        if self.cpu is not None:
            self.cpu.close()


@pytest.fixture
def procs(moto_server: MotoServer, kinesalite: NodeEmulator, tmp_path: Path) -> Iterator[ProcessStack]:
    stack = ProcessStack(moto_server, kinesalite, tmp_path / "ledger.txt")
    yield stack
    stack.close()


@pytest.fixture
def procs_metrics_off(moto_server: MotoServer, kinesalite: NodeEmulator, tmp_path: Path) -> Iterator[ProcessStack]:
    stack = ProcessStack(moto_server, kinesalite, tmp_path / "ledger.txt", metrics=False)
    yield stack
    stack.close()


def test_killed_agent_shards_resume_elsewhere_from_the_last_checkpoint(procs: ProcessStack) -> None:
    procs.start_agent("agent-1")
    wait_for(lambda: set(procs.owners().values()) == {"agent-1"} and len(procs.owners()) == 3, 30, "agent-1 owns all")
    procs.produce(300, "a")
    wait_for(procs.all_delivered, 30, "first records delivered")
    procs.start_agent("agent-2")
    wait_for(lambda: "agent-2" in procs.owners().values(), 30, "agent-2 gets a lease")

    # Each process reports the CPU its own fixture shows: 15 % plus 20 % per lease it processes.
    wait_for(lambda: len(procs.cpu_reported("agent-2")) >= 2, 30, "agent-2's CPU reports")
    assert procs.cpu_reported("agent-1") and max(procs.cpu_reported("agent-1")) > 30.0
    victim = procs.agents["agent-1"]
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    killed_at = time.time()
    procs.produce(300, "b")
    wait_for(procs.all_delivered, 60, "records after the kill delivered")
    assert set(procs.owners().values()) == {"agent-2"}
    entries = read_ledger(procs.ledger)
    resumed = min(entry[4] for entry in entries if entry[3] == "agent-2" and entry[5].startswith("b-"))
    assert resumed - killed_at < 30
    counts = procs.delivered()
    assert set(counts) == set(procs.produced)  # nothing lost
    # Each batch is checkpointed right after it is written, so a kill can repeat at most the unfinished batch.
    duplicates = [data for data, count in counts.items() if count > 1]
    assert all(data.startswith("a-") for data in duplicates)


def test_sigterm_drains_and_a_restart_resumes_without_duplicates(procs_metrics_off: ProcessStack) -> None:
    procs = procs_metrics_off  # the one run with worker metrics off (balanced by throughput)
    first = procs.start_agent("agent-1")
    wait_for(lambda: len(procs.owners()) == 3 and set(procs.owners().values()) == {"agent-1"}, 30, "agent-1 owns all")
    procs.produce(300, "a")
    wait_for(procs.all_delivered, 30, "records delivered")
    first.send_signal(signal.SIGTERM)
    assert first.wait(60) == 0
    assert set(procs.owners().values()) == {None}  # no other worker: leases given back with their checkpoints
    procs.produce(300, "b")
    procs.start_agent("agent-2")
    wait_for(procs.all_delivered, 60, "records after the restart delivered")
    counts = procs.delivered()
    assert set(counts) == set(procs.produced)
    assert max(counts.values()) == 1  # resumed exactly from the checkpoints
    assert procs.cpu_reported("agent-2") == ()  # metrics off: no CPU history, balanced by throughput


def test_the_ported_kcl_processor_of_the_migration_guide_reads_and_checkpoints_every_record(
        procs_metrics_off: ProcessStack, tmp_path: Path) -> None:
    """examples/ported_processor.py as docs/migrate-from-kcl.md runs it: every record in its output, and after a
    SIGTERM each shard's checkpoint is its last record (the handoff's checkpoint)."""
    procs = procs_metrics_off
    output = tmp_path / "ported"
    agent = procs.start_agent("ported-1", "examples.ported_processor:PortedProcessor", EXAMPLE_OUTPUT=str(output))
    wait_for(lambda: set(procs.owners().values()) == {"ported-1"}, 30, "the agent owns every shard")
    procs.produce(200, "p")

    def written() -> list[str]:
        return sorted(line for path in output.glob("*.txt") for line in path.read_text().splitlines())

    wait_for(lambda: written() == sorted(procs.produced), 30, "every record in the processor's output")
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(60) == 0
    last = {}
    for shard in procs.kinesis.list_shards(StreamName=procs.app)["Shards"]:
        iterator = procs.kinesis.get_shard_iterator(StreamName=procs.app, ShardId=shard["ShardId"],
                                                    ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        records = procs.kinesis.get_records(ShardIterator=iterator, Limit=1000)["Records"]
        if records:
            last[shard["ShardId"]] = records[-1]["SequenceNumber"]
    checkpoints = {lease.lease_key: str(lease.checkpoint) for lease in procs.coordinator.store.scan_leases().leases}
    assert last and all(checkpoints[shard] == sequence for shard, sequence in last.items()), (last, checkpoints)


def test_a_restart_with_a_reservation_moves_nothing_and_the_same_worker_resumes_from_the_checkpoints(
        procs_metrics_off: ProcessStack) -> None:
    """`shutdown_mode=restart` (decision 0035): SIGTERM keeps the leases past the failover time (2 s here) while the
    other agent could take them, and the process coming back under the same id reads on from the checkpoints."""
    procs = procs_metrics_off
    restarting = {"SHARDHERD_SHUTDOWN_MODE": "restart", "SHARDHERD_RESTART_WINDOW_MILLIS": "60000"}
    first = procs.start_agent("agent-1", **restarting)
    wait_for(lambda: len(procs.owners()) == 3 and set(procs.owners().values()) == {"agent-1"}, 30, "agent-1 owns all")
    procs.start_agent("agent-2")
    procs.produce(300, "a")
    wait_for(lambda: procs.all_delivered() and "agent-2" in procs.owners().values()
             and None not in procs.owners().values(), 30, "records delivered, agent-2 holding a share")
    owners = procs.owners()
    kept = {key for key, owner in owners.items() if owner == "agent-1"}
    assert kept
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0
    record = worker_record(procs.coordinator.store, "agent-1")
    assert record is not None and record.restart_within_ms == 60_000  # the row stays, with the reservation
    procs.produce(300, "b")
    time.sleep(3 * 2.0)  # three failover times: without the reservation agent-2 would have them by now
    assert procs.owners() == owners
    procs.start_agent("agent-1", **restarting)
    wait_for(procs.all_delivered, 30, "records after the restart delivered")
    assert procs.owners() == owners  # not one move
    counts = procs.delivered()
    assert set(counts) == set(procs.produced) and max(counts.values()) == 1  # from the checkpoints, no duplicate
    wait_for(lambda: (row := worker_record(procs.coordinator.store, "agent-1")) is not None
             and row.restart_within_ms is None, 10, "the returned worker cleared its reservation")
