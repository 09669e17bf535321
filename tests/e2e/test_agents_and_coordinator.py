"""Coordinator and agents in one process on real emulators (moto server DynamoDB, kinesalite), short intervals.

Checks the data path end to end: every record delivered, in order per shard, graceful moves without duplicates,
drain on stop, and a split followed (parents finished before children start, nothing lost). CPU metrics are on, as
users run them: each agent reads its own driven cgroup tree or ECS metadata endpoint (tests/support/cpu_fixtures.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardherd.agent.runtime import Agent
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.lease import Lease
from shardherd.shared.supervision import Kind
from shardherd.shared.worker import CPU_METRIC
from tests.support.cpu_fixtures import CpuFleet
from tests.support.fast_settings import FAST_READS
from tests.support.ledger import Ledger, LedgerProcessor
from tests.support.stores import worker_record
from tests.support.stream_stack import StreamStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow



class Stack(StreamStack):
    """A coordinator and any number of in-process agents sharing one application on the session's emulators."""

    def __init__(self, moto: MotoServer, kinesalite: NodeEmulator, shards: int, cpu_root: Path) -> None:
        # Failover 4 s: with every agent sampling and reporting CPU the suite stays stable on a loaded 2-core host.
        super().__init__(moto, kinesalite, shards, failover_millis=4000, disable_worker_metrics=False,
                         in_memory_worker_metrics_capture_frequency_millis=200)
        self.ledger = Ledger()
        self.agents: dict[str, Agent] = {}
        self.cpu = CpuFleet(cpu_root, holders=lambda: self.owners().values())

    def add_agent(self, worker: str, cpu_percent: float | None = None,
                  before_start: Callable[[Agent], None] | None = None) -> Agent:
        """Start an agent whose CPU follows its leases, or stays at `cpu_percent` when given."""
        source = self.cpu.add(worker)
        if cpu_percent is not None:
            self.cpu.set(worker, cpu_percent)
        agent = Agent(self.settings(worker, **source.overrides()), lambda: LedgerProcessor(self.ledger, worker),
                      limits=FAST_READS)
        if before_start is not None:
            before_start(agent)
        self.agents[worker] = agent.start()
        return agent

    def cpu_reported(self, worker: str) -> tuple[float, ...]:
        record = worker_record(self.coordinator.store, worker)
        return () if record is None else tuple(record.metric_stats.get(CPU_METRIC, ()))

    def all_delivered(self) -> bool:
        return set(self.ledger.payloads()) >= set(self.produced)

    def close(self) -> None:
        for agent in self.agents.values():
            agent.stop(drain=False)
        self.cpu.close()
        super().close()


@pytest.fixture
def stack(moto_server: MotoServer, kinesalite: NodeEmulator, tmp_path: Path) -> Iterator[Stack]:
    created = Stack(moto_server, kinesalite, shards=4, cpu_root=tmp_path / "cpu")
    yield created
    created.close()


def _assert_in_order(ledger: Ledger) -> None:
    for shard, positions in ledger.by_shard().items():
        assert positions == sorted(positions), f"{shard} delivered out of order"


def test_a_stop_while_a_lease_s_reader_is_starting_waits_for_it_and_stops_it(stack: Stack) -> None:
    """CI at 18aa8c4: `stop` joined a shard thread not yet started (RuntimeError) when a lease came at that moment."""
    entered, released = threading.Event(), threading.Event()

    def slow_shard_starts(agent: Agent) -> None:
        start = agent.supervisor.thread

        def held_at_the_start(name: str, body: Callable[[], object], kind: Kind = Kind.RESTARTABLE) -> threading.Thread:
            if name.startswith("shard-"):
                entered.set()
                released.wait(30)
            return start(name, body, kind)

        agent.supervisor.thread = held_at_the_start  # type: ignore[method-assign]

    agent = stack.add_agent("agent-1", before_start=slow_shard_starts)
    assert entered.wait(30), "the leader gave agent-1 a lease"
    failures: list[BaseException] = []

    def stop() -> None:
        try:
            agent.stop(drain=False)
        except BaseException as failure:  # the test reports it
            failures.append(failure)

    stopper = threading.Thread(target=stop)
    stopper.start()
    stopper.join(0.5)  # the stop reaches the workers while the lease's reader is still starting
    released.set()
    stopper.join(30)
    assert not stopper.is_alive() and failures == [] and agent.stopped.is_set()
    assert not any(worker.thread.is_alive() for worker in agent.workers.values())
    stack.agents.clear()


def test_records_flow_and_graceful_moves_have_no_duplicates(stack: Stack) -> None:
    stack.add_agent("agent-1")
    wait_for(lambda: len(stack.owners()) == 4 and set(stack.owners().values()) == {"agent-1"}, 30, "agent-1 owns 4")
    stack.produce(400, "a")
    wait_for(stack.all_delivered, 30, "first 400 records delivered")

    def leases() -> list[Lease]:  # progress rides on each lease with its checkpoint (the heartbeat row stays small)
        return stack.coordinator.store.scan_leases().leases

    wait_for(lambda: sum(lease.records_processed or 0 for lease in leases()) == 400, 10,
             "the checkpoints to carry progress")  # lag, records, bytes per lease
    assert all(lease.millis_behind_latest is not None and (lease.bytes_processed or 0) >= (lease.records_processed or 0)
               for lease in leases())
    # Read at the stream's tip: nothing behind, and the agent knows it.
    wait_for(lambda: [lease.records_behind for lease in leases()] == [0] * 4, 10, "records behind 0 on every lease")

    stack.add_agent("agent-2")  # balancing hands two leases over gracefully, with their checkpoints
    wait_for(lambda: list(stack.owners().values()).count("agent-2") == 2, 30, "agent-2 owns 2 leases")
    stack.produce(400, "b")
    wait_for(stack.all_delivered, 30, "second 400 records delivered")
    payloads = stack.ledger.payloads()
    assert len(payloads) == len(set(payloads)) == 800  # graceful handoffs: no record processed twice
    _assert_in_order(stack.ledger)
    moved = [shard for shard, owner in stack.owners().items() if owner == "agent-2"]
    assert all("agent-2" in stack.ledger.workers_of(shard) for shard in moved)

    stack.agents.pop("agent-2").stop(drain=True)  # a deploy: drained, its shards handed back with checkpoints
    assert set(stack.owners().values()) == {"agent-1"}
    stack.produce(200, "c")
    wait_for(stack.all_delivered, 30, "records after the drain delivered")
    payloads = stack.ledger.payloads()
    assert len(payloads) == len(set(payloads)) == 1000


def test_split_under_load_finishes_parent_before_children(stack: Stack) -> None:
    stack.add_agent("agent-1")
    wait_for(lambda: len(stack.owners()) == 4, 30, "4 leases")
    stack.produce(200, "before")
    wait_for(stack.all_delivered, 30, "records before the split")
    parent = "shardId-000000000000"
    description = stack.kinesis.describe_stream(StreamName=stack.app)["StreamDescription"]
    hash_range = next(s["HashKeyRange"] for s in description["Shards"] if s["ShardId"] == parent)
    middle = (int(hash_range["StartingHashKey"]) + int(hash_range["EndingHashKey"])) // 2
    stack.kinesis.split_shard(StreamName=stack.app, ShardToSplit=parent, NewStartingHashKey=str(middle))
    wait_for(lambda: stack.status() == "ACTIVE", 30, "split done")
    stack.produce(400, "after")
    wait_for(stack.all_delivered, 60, "records after the split, children included")
    owners = stack.owners()
    children = [key for key in owners if key not in {f"shardId-00000000000{i}" for i in range(4)}]
    assert len(children) == 2
    by_shard = stack.ledger.by_shard()
    assert all(by_shard.get(child) for child in children)  # children were read
    parent_entries = [index for index, entry in enumerate(stack.ledger.entries) if entry[0] == parent]
    child_entries = [index for index, entry in enumerate(stack.ledger.entries) if entry[0] in children]
    assert max(parent_entries) < min(child_entries)  # never before the parent ended
    payloads = stack.ledger.payloads()
    assert len(payloads) == len(set(payloads)) == 600
    _assert_in_order(stack.ledger)


def test_merge_under_load_finishes_both_parents_before_the_child(stack: Stack) -> None:
    stack.add_agent("agent-1")
    stack.add_agent("agent-2")
    wait_for(lambda: len(stack.owners()) == 4 and None not in stack.owners().values(), 30, "4 leases owned")
    stack.produce(200, "before")
    wait_for(stack.all_delivered, 30, "records before the merge")
    parents = ["shardId-000000000002", "shardId-000000000003"]  # adjacent hash ranges
    stack.kinesis.merge_shards(StreamName=stack.app, ShardToMerge=parents[0], AdjacentShardToMerge=parents[1])
    wait_for(lambda: stack.status() == "ACTIVE", 30, "merge done")
    stack.produce(400, "after")
    wait_for(stack.all_delivered, 60, "records after the merge, the child included")
    children = [key for key in stack.owners() if key not in {f"shardId-00000000000{i}" for i in range(4)}]
    assert len(children) == 1
    entries = stack.ledger.entries
    last_parent = max(index for index, entry in enumerate(entries) if entry[0] in parents)
    first_child = min(index for index, entry in enumerate(entries) if entry[0] == children[0])
    assert last_parent < first_child  # the child starts only after both parents ended
    payloads = stack.ledger.payloads()
    assert len(payloads) == len(set(payloads)) == 600
    _assert_in_order(stack.ledger)


def test_the_cpu_figures_agents_report_drive_the_balance(stack: Stack) -> None:
    stack.add_agent("agent-1", cpu_percent=85.0)
    wait_for(lambda: len(stack.owners()) == 4 and set(stack.owners().values()) == {"agent-1"}, 30, "agent-1 owns 4")
    wait_for(lambda: len(stack.cpu_reported("agent-1")) >= 2, 15, "agent-1's CPU reports")
    assert all(abs(value - 85.0) < 10 for value in stack.cpu_reported("agent-1")[1:])  # its own fixture's figure
    stack.add_agent("agent-2", cpu_percent=10.0)
    stack.produce(200, "a")
    wait_for(lambda: "agent-2" in stack.owners().values(), 30, "the hot agent sheds leases to the idle one")
    wait_for(stack.all_delivered, 30, "records delivered")
    assert stack.cpu_reported("agent-2") and all(value < 20 for value in stack.cpu_reported("agent-2")[1:])
    payloads = stack.ledger.payloads()
    assert len(payloads) == len(set(payloads)) == 200
