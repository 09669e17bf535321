"""A shard an agent cannot process is retried with backoff, then given back visibly, and read by another worker.

Real parts: a coordinator and agents in this process on moto server (DynamoDB) and kinesalite, short intervals.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shardherd.agent.runtime import Agent
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.checkpoint import Checkpoint
from tests.support.fast_settings import FAST_READS
from tests.support.ledger import Ledger, LedgerProcessor
from tests.support.stores import worker_record
from tests.support.stream_stack import StreamStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

BAD_SHARD = "shardId-000000000001"


class BrokenOn(LedgerProcessor):
    """A ledger processor whose `initialize()` raises for one shard (a bad dependency on one host, say)."""

    def initialize(self, shard_id: str, start: Checkpoint) -> None:
        if shard_id == BAD_SHARD:
            raise RuntimeError(f"cannot open the sink for {shard_id}")
        super().initialize(shard_id, start)


class Stack(StreamStack):
    """A coordinator and in-process agents; each agent's processor and settings are chosen by the test."""

    def __init__(self, moto: MotoServer, kinesalite: NodeEmulator, **overrides: Any) -> None:
        super().__init__(moto, kinesalite, 3, prefix="shard-fail", **overrides)
        self.ledger = Ledger()
        self.agents: dict[str, Agent] = {}

    def add_agent(self, worker: str, broken: bool = False, **settings: Any) -> Agent:
        kind = BrokenOn if broken else LedgerProcessor
        agent = Agent(self.settings(worker, **settings), lambda: kind(self.ledger, worker), limits=FAST_READS)
        self.agents[worker] = agent.start()
        return agent

    def all_delivered(self) -> bool:
        return set(self.ledger.payloads()) >= set(self.produced)

    def refused(self, worker: str) -> dict[str, int]:
        record = worker_record(self.coordinator.store, worker)
        return {} if record is None else {key: p.failures for key, p in record.lease_progress.items() if p.refused}

    def close(self) -> None:
        for agent in self.agents.values():
            agent.stop(drain=False)
        super().close()


@pytest.fixture
def stack(moto_server: MotoServer, kinesalite: NodeEmulator) -> Iterator[Stack]:
    created = Stack(moto_server, kinesalite)
    yield created
    created.close()


def test_a_shard_whose_processor_cannot_start_is_given_back_and_read_elsewhere(
        stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        stack.add_agent("agent-1", broken=True)
        wait_for(lambda: set(stack.owners().values()) == {"agent-1"} and len(stack.owners()) == 3, 30,
                 "agent-1 holds every lease")
        stack.produce(150, "a")
        # Attempts after 0, 1 and 2 s of backoff, then the lease goes back (visible in the store and the record).
        wait_for(lambda: stack.refused("agent-1").get(BAD_SHARD) == 3, 30, "agent-1 reports the shard refused")
        stack.add_agent("agent-2")
        wait_for(lambda: stack.owners().get(BAD_SHARD) == "agent-2", 60, "the refused shard taken by agent-2")
        wait_for(stack.all_delivered, 60, "every record delivered")

    assert set(stack.ledger.workers_of(BAD_SHARD)) == {"agent-2"}
    other = [key for key in stack.owners() if key != BAD_SHARD]
    assert all("agent-1" in stack.ledger.workers_of(key) for key in other)  # its healthy shards kept flowing
    messages = [record.getMessage() for record in caplog.records]
    assert any(f"{BAD_SHARD}: attempt 1 of 3 failed (RuntimeError" in message for message in messages)
    assert any(f"{BAD_SHARD}: 3 attempts failed" in message for message in messages)
    assert any(f"lease {BAD_SHARD} given back" in message for message in messages)
    payloads = stack.ledger.payloads()
    assert len(payloads) == len(set(payloads)) == 150


def test_a_worker_without_the_initial_timestamp_gives_at_timestamp_leases_to_one_that_has_it(
        moto_server: MotoServer, kinesalite: NodeEmulator) -> None:
    start = datetime.now(UTC) - timedelta(minutes=5)
    stack = Stack(moto_server, kinesalite, initial_position_in_stream="AT_TIMESTAMP", initial_timestamp=start)
    try:
        stack.add_agent("agent-1", initial_position_in_stream="TRIM_HORIZON", initial_timestamp=None)
        wait_for(lambda: bool(stack.refused("agent-1")), 40, "agent-1 gives a lease back")
        stack.add_agent("agent-2")
        stack.produce(90, "t")
        wait_for(lambda: set(stack.owners().values()) == {"agent-2"}, 60, "agent-2 holds every lease")
        wait_for(stack.all_delivered, 60, "every record delivered")
        assert {worker for shard in stack.owners() for worker in stack.ledger.workers_of(shard)} == {"agent-2"}
    finally:
        stack.close()
