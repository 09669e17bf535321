"""A gracefully stopped agent leaves no worker row behind, so no leader (shardherd's or a Java KCL one) assigns to it.

Real parts: a coordinator and agents in this process on moto server (DynamoDB) and kinesalite, short intervals, in
`lease` mode (the mode of mixed fleets with KCL workers).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from tests.agent.test_shard_failures import Stack
from tests.support.kcl_rows import read_raw_worker_row
from tests.support.stores import worker_record
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(moto_server: MotoServer, kinesalite: NodeEmulator) -> Iterator[Stack]:
    created = Stack(moto_server, kinesalite, liveness_mode="lease")
    yield created
    created.close()


def test_a_drained_agent_deletes_its_row_and_gets_no_lease_afterwards(stack: Stack, moto_server: MotoServer) -> None:
    stack.add_agent("agent-1")
    stack.add_agent("agent-2")
    wait_for(lambda: set(stack.owners().values()) == {"agent-1", "agent-2"}, 60, "both agents hold leases")
    stack.produce(100, "a")
    stack.agents.pop("agent-1").stop(drain=True)  # the real stop path: drain, release, delete the row
    store = stack.coordinator.store
    assert worker_record(store, "agent-1") is None
    client = make_client("dynamodb", "us-east-1", moto_server.endpoint_url)
    assert read_raw_worker_row(client, store.tables.worker_metrics, "agent-1") is None  # a KCL leader sees no row
    assert worker_record(store, "agent-2") is not None
    wait_for(lambda: set(stack.owners().values()) == {"agent-2"}, 30, "agent-2 holds every lease")
    time.sleep(10 * stack.coordinator.settings.lease_assignment_interval_millis / 1000)
    assert set(stack.owners().values()) == {"agent-2"}
    wait_for(stack.all_delivered, 30, "every record delivered")
