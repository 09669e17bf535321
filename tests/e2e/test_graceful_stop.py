"""A gracefully stopped agent leaves no worker row behind, so no leader (shardherd's or a Java KCL one) assigns to it.

Real parts: a coordinator and agents in this process on moto server (DynamoDB) and kinesalite, short intervals, in
`lease` mode (the mode of mixed fleets with KCL workers).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agent.read_spec import ReadLimits
from agent.runtime import Agent
from services.emulators.kinesalite import NodeEmulator
from services.emulators.moto_server import MotoServer
from shared.aws import make_client
from tests.support.kcl_rows import read_raw_worker_row
from tests.support.ledger import Ledger, LedgerProcessor
from tests.support.stream_stack import StreamStack, wait_for

pytestmark = pytest.mark.slow

FAST_READS = ReadLimits(min_call_interval=0.05, idle_backoff=0.1)


class Stack(StreamStack):
    def __init__(self, moto: MotoServer, kinesalite: NodeEmulator) -> None:
        super().__init__(moto, kinesalite, 4, prefix="graceful-stop", liveness_mode="lease")
        self.ledger = Ledger()
        self.agents: dict[str, Agent] = {}

    def add_agent(self, worker: str) -> None:
        agent = Agent(self.settings(worker), lambda: LedgerProcessor(self.ledger, worker), limits=FAST_READS)
        self.agents[worker] = agent.start()

    def close(self) -> None:
        for agent in self.agents.values():
            agent.stop(drain=False)
        super().close()


@pytest.fixture
def stack(moto_server: MotoServer, kinesalite: NodeEmulator) -> Iterator[Stack]:
    created = Stack(moto_server, kinesalite)
    yield created
    created.close()


def test_a_drained_agent_deletes_its_row_and_gets_no_lease_afterwards(stack: Stack, moto_server: MotoServer) -> None:
    stack.add_agent("agent-1")
    stack.add_agent("agent-2")
    wait_for(lambda: sorted(map(str, stack.owners().values())) == ["agent-1"] * 2 + ["agent-2"] * 2, 60,
             "two leases each")
    stack.produce(100, "a")
    stack.agents.pop("agent-1").stop(drain=True)  # the real stop path: drain, release, delete the row
    store = stack.coordinator.store
    assert store.get_worker("agent-1") is None
    client = make_client("dynamodb", "us-east-1", moto_server.endpoint_url)
    assert read_raw_worker_row(client, store.tables.worker_metrics, "agent-1") is None  # a KCL leader sees no row
    assert store.get_worker("agent-2") is not None
    wait_for(lambda: set(stack.owners().values()) == {"agent-2"}, 30, "agent-2 holds every lease")
    time.sleep(10 * stack.coordinator.settings.lease_assignment_interval_millis / 1000)
    assert set(stack.owners().values()) == {"agent-2"}
    wait_for(lambda: set(stack.ledger.payloads()) >= set(stack.produced), 30, "every record delivered")
