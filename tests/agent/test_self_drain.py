"""An agent drains itself through its health port (the Spark driver pod's preStop hook): no admin token in the pod.

Real parts: a coordinator in this process and agents on moto server and kinesalite over HTTP; the hook is the command
of helm/examples/driver-pod-template.yaml, run as written in a child process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml  # type: ignore[import-untyped]  # types-PyYAML is not a dev dependency

from shardherd.agent.health_server import is_loopback
from shardherd.agent.runtime import Agent
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
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
