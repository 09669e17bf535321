"""An agent drains itself through its health port (the Spark driver pod's preStop hook): no admin token in the pod.
And the process that comes back under a restart reservation's worker id (decision 0035) heartbeats at once.

Real parts: a coordinator in this process and agents on moto server and kinesalite over HTTP; the hook is the command
of helm/examples/driver-pod-template.yaml, run as written in a child process. The restart tests measure the agents'
CPU from their process tree with the production CPU timing (a sample a second: a new worker's first report comes 2 s
after its start).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml  # type: ignore[import-untyped]  # types-PyYAML is not a dev dependency

from shardherd.agent.health_server import is_loopback
from shardherd.agent.runtime import Agent
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.config import Settings
from shardherd.shared.worker import CPU_METRIC, WorkerRecord
from shardherd.shared.worker_metrics import WorkerStatus, classify
from tests.deploy.rendering import EXAMPLES
from tests.support.ledger import Ledger, LedgerProcessor
from tests.support.stores import worker_record
from tests.support.stream_stack import StreamStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(moto_server: MotoServer, kinesalite: NodeEmulator) -> Iterator[StreamStack]:
    created = StreamStack(moto_server, kinesalite, 2, prefix="self-drain")
    yield created
    created.close()


def start_agent(stack: StreamStack, ledger: Ledger, name: str) -> Agent:
    """An agent with its health port on (a free port), writing what it processes to `ledger`."""
    return Agent(stack.settings(name, agent_health_port=0), lambda: LedgerProcessor(ledger, name)).start()


def test_only_loopback_callers_count_as_the_agents_own_pod() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.5.0.1") and is_loopback("::1")
    assert is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("10.0.3.7") and not is_loopback("::ffff:10.0.3.7") and not is_loopback("localhost")


def test_the_prestop_hook_drains_the_agent_through_its_health_port(stack: StreamStack) -> None:
    ledger = Ledger()
    agents = {name: start_agent(stack, ledger, name) for name in ("driver-1", "driver-2")}
    try:
        wait_for(lambda: {"driver-1", "driver-2"} <= set(stack.owners().values()), 60, "both agents hold leases")
        doomed = agents["driver-1"]
        assert doomed.health is not None
        port = doomed.health.port
        stack.produce(40, "d")
        wait_for(lambda: len(ledger.payloads()) >= 40, 30, "records delivered")
        template = yaml.safe_load((EXAMPLES / "driver-pod-template.yaml").read_text(encoding="utf-8"))
        command = template["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
        assert command[0] == "python"
        env = {"PATH": os.environ.get("PATH", ""), "SHARDHERD_AGENT_HEALTH_PORT": str(port)}  # no token at all
        subprocess.run([sys.executable, *command[1:]], env=env, check=True, timeout=60)
        assert doomed.stopped.is_set()  # the hook returned once the agent had drained and stopped
        assert set(stack.owners().values()) == {"driver-2"}
        with pytest.raises(httpx.TransportError):  # the health port closed with the agent
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        stack.produce(40, "e")
        wait_for(lambda: set(ledger.payloads()) >= set(stack.produced), 30, "every record delivered")
        payloads = ledger.payloads()
        assert len(payloads) == len(set(payloads))  # a graceful drain repeats nothing
    finally:
        for agent in agents.values():
            if not agent.stopped.is_set():
                agent.stop(drain=False)


def test_the_health_port_stops_the_agent_for_a_restart_and_the_same_id_resumes_its_leases(
        stack: StreamStack) -> None:
    """`POST /drain?restart=30s` (decision 0035): the agent checkpoints, stops and keeps its leases reserved; the other
    agent gets none of them, and the agent started again under the same id reads on from the checkpoints."""
    ledger = Ledger()
    agents = {name: start_agent(stack, ledger, name) for name in ("driver-1", "driver-2")}
    try:
        wait_for(lambda: {"driver-1", "driver-2"} <= set(stack.owners().values()), 60, "both agents hold leases")
        stack.produce(40, "r")
        wait_for(lambda: len(ledger.payloads()) >= 40, 30, "records delivered")
        doomed = agents["driver-1"]
        assert doomed.health is not None
        url = f"http://127.0.0.1:{doomed.health.port}/drain"
        bad = httpx.post(url, params={"restart": "soon"}, timeout=5)
        assert bad.status_code == 400 and "is not a duration" in bad.json()["status"]
        assert not doomed.stopped.is_set()  # a bad window stops nothing
        owners = stack.owners()
        stopped = httpx.post(url, params={"restart": "30s", "wait": "20"}, timeout=25)
        assert stopped.status_code == 200 and doomed.stopped.is_set()
        record = worker_record(stack.coordinator.store, "driver-1")
        assert record is not None and record.restart_within_ms == 30_000
        stack.produce(40, "s")
        time.sleep(5.0)  # two and a half failover times (2 s here)
        assert stack.owners() == owners  # nothing moved to driver-2
        agents["driver-1"] = start_agent(stack, ledger, "driver-1")
        wait_for(lambda: set(ledger.payloads()) >= set(stack.produced), 30, "every record delivered")
        assert stack.owners() == owners
        payloads = ledger.payloads()
        assert len(payloads) == len(set(payloads))  # resumed from the checkpoints: nothing repeated
    finally:
        for agent in agents.values():
            if not agent.stopped.is_set():
                agent.stop(drain=False)


def _settings(stack: StreamStack, tmp_path: Path) -> Settings:
    # The production CPU timing: a sample a second, a new worker's first report after two of them (2 s).
    return stack.settings("a1", disable_worker_metrics=False, cgroup_root=str(tmp_path),
                          in_memory_worker_metrics_capture_frequency_millis=1000,
                          worker_metrics_reporter_freq_millis=30_000)


def _row(stack: StreamStack) -> WorkerRecord:
    row = worker_record(stack.coordinator.store, "a1")
    assert row is not None
    return row


def test_the_restarted_process_writes_its_first_row_at_once_valid_and_reads_on(stack: StreamStack,
                                                                               tmp_path: Path) -> None:
    """A new worker's first row waits for its first CPU report (decision 0038); the leases a reservation keeps are
    unread until the returning process's first row lands, so that one goes at once with the row's CPU history."""
    settings = _settings(stack, tmp_path)
    ledger = Ledger()
    agent = Agent(settings, lambda: LedgerProcessor(ledger, "a1")).start()
    try:
        stack.wait_owned("a1")
        wait_for(lambda: len(_row(stack).metric_stats.get(CPU_METRIC, ())) >= 2, 10, "a CPU history in the row")
        stack.produce(20, "before")
        wait_for(lambda: set(ledger.payloads()) >= set(stack.produced), 30, "the records delivered")
        agent.stop(restart_ms=30_000)
        left = _row(stack)
        assert left.restart_within_ms == 30_000 and classify(left) is WorkerStatus.ACTIVE
        owners = stack.owners()
        stack.produce(20, "during")
        started = time.monotonic()
        agent = Agent(settings, lambda: LedgerProcessor(ledger, "a1")).start()
        wait_for(lambda: _row(stack) != left, 10, "the new process's first row (then the reservation cleared)")
        assert time.monotonic() - started < 1.5  # a new worker's first row comes 2 s after its start at the earliest
        first = _row(stack)
        assert classify(first) is WorkerStatus.ACTIVE and first.metric_stats == left.metric_stats
        wait_for(lambda: set(ledger.payloads()) >= set(stack.produced), 30, "every record delivered")
        assert stack.owners() == owners
        payloads = ledger.payloads()
        assert len(payloads) == len(set(payloads))  # resumed from the checkpoints: nothing repeated
        wait_for(lambda: _row(stack).restart_within_ms is None, 10, "the reservation cleared")
    finally:
        if not agent.stopped.is_set():
            agent.stop(drain=False)


def test_a_start_without_a_reservation_still_waits_for_its_first_report(stack: StreamStack, tmp_path: Path) -> None:
    """A worker stopped by a drain left no reservation: its next process is a new worker (decision 0038)."""
    settings = _settings(stack, tmp_path)
    agent = Agent(settings, lambda: LedgerProcessor(Ledger(), "a1")).start()
    try:
        stack.wait_owned("a1")
        wait_for(lambda: CPU_METRIC in _row(stack).metric_stats, 10, "a CPU history in the row")
        agent.stop(drain=False)  # gives its leases back and retires its row
        started = time.monotonic()
        agent = Agent(settings, lambda: LedgerProcessor(Ledger(), "a1")).start()
        wait_for(lambda: (row := worker_record(stack.coordinator.store, "a1")) is not None and row.heartbeat == 1,
                 10, "the new process's first row")
        assert time.monotonic() - started >= 2.0
        assert classify(_row(stack)) is WorkerStatus.ACTIVE  # its own first report
    finally:
        if not agent.stopped.is_set():
            agent.stop(drain=False)
