"""A shard an agent cannot process is retried with backoff, then given back visibly, and read by another worker.

Real parts: a coordinator and agents in this process on moto server (DynamoDB) and kinesalite, short intervals.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from shardherd.agent.consumer import Checkpointer
from shardherd.agent.records import Record
from shardherd.agent.runtime import Agent
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.supervision import EXIT_GAVE_UP
from tests.chaos.inject import raise_in, targets
from tests.support.chaos_proxy import CALM, Chaos, ChaosProxy
from tests.support.fast_settings import FAST_READS
from tests.support.faulty_proxy import INTERNAL_ERROR, Fault, FaultyProxy
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


class PoisonOn(LedgerProcessor):
    """A ledger processor whose batches of one shard always fail (a record its sink rejects, say)."""

    shard = ""

    def initialize(self, shard_id: str, start: Checkpoint) -> None:
        self.shard = shard_id
        super().initialize(shard_id, start)

    def process_records(self, records: list[Record], checkpointer: Checkpointer,
                        millis_behind_latest: int | None) -> None:
        if self.shard == BAD_SHARD and records:
            raise ValueError("the sink rejects record " + records[0].sequence_number)
        super().process_records(records, checkpointer, millis_behind_latest)


class Stack(StreamStack):
    """A coordinator and in-process agents; each agent's processor and settings are chosen by the test."""

    def __init__(self, moto: MotoServer, kinesalite: NodeEmulator, **overrides: Any) -> None:
        super().__init__(moto, kinesalite, 3, prefix="shard-fail", **overrides)
        self.ledger = Ledger()
        self.agents: dict[str, Agent] = {}

    def add_agent(self, worker: str, broken: bool = False, kind: type[LedgerProcessor] | None = None,
                  exit: Callable[[int], None] | None = None, **settings: Any) -> Agent:
        made = kind or (BrokenOn if broken else LedgerProcessor)
        agent = Agent(self.settings(worker, **settings), lambda: made(self.ledger, worker), limits=FAST_READS,
                      exit=exit)
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


def test_a_batch_that_always_fails_blocks_its_shard_visibly_with_a_growing_wait(
        stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    """Bug 6: retried every second forever with a traceback each time, and nothing told the operator."""
    with caplog.at_level(logging.ERROR):
        # Never bisected here (poison_attempts at its maximum): tests/agent/test_poison_records.py covers that.
        agent = stack.add_agent("agent-1", kind=PoisonOn, agent_health_port=0, poison_attempts=1000)
        wait_for(lambda: set(stack.owners().values()) == {"agent-1"} and len(stack.owners()) == 3, 30,
                 "agent-1 holds every lease")
        stack.produce(60, "p")
        wait_for(lambda: BAD_SHARD in agent.progress.failing(), 30, "the shard stuck on its batch")
        first = time.monotonic()
        time.sleep(7.5)  # 1 + 2 + 4 s of backoff: four attempts (a second apart, it was eight)
        failing = agent.progress.failing()[BAD_SHARD]
        assert 3 <= failing.attempts <= 5 and failing.last_error.startswith("ValueError: the sink rejects record")
        assert failing.since <= time.time() - (time.monotonic() - first) + 0.5
        assert agent.health is not None
        metrics = httpx.get(f"http://127.0.0.1:{agent.health.port}/metrics", timeout=5).text
        assert 'shardherd_shard_failing_batch_attempts{last_error="ValueError: the sink rejects record' in metrics
        assert f'shardherd_shard_failing_batch_seconds{{lease="{BAD_SHARD}"}}' in metrics
        calls = re.search(rf'^shardherd_shard_get_records_calls_total{{lease="{BAD_SHARD}"}} (\d+)', metrics, re.M)
        assert calls is not None and int(calls[1]) >= 1  # each shard's reads and throttles (decision 0029)
        assert f'shardherd_shard_read_throttled_total{{lease="{BAD_SHARD}"}} 0.0' in metrics
        # The leader's view: the worker row carries it, the coordinator's API (and dashboard alert) shows it.
        api = stack.coordinator.api
        assert api is not None
        wait_for(lambda: any(item["lease_key"] == BAD_SHARD and (item["failing_attempts"] or 0) >= 2
                             for item in httpx.get(f"{api.url}/v1/assignments", timeout=5).json()["items"]), 10,
                 "the stuck shard in the coordinator's API")
    lines = [record for record in caplog.records if BAD_SHARD in record.getMessage()]
    assert len(lines) == failing.attempts and all(record.exc_info is None for record in lines)  # no tracebacks
    assert stack.owners()[BAD_SHARD] == "agent-1"  # it blocks (no skipping): the poison-record policy decides later
    assert stack.ledger.workers_of(BAD_SHARD) == []  # nothing of the shard delivered past the failing batch
    others = [key for key in stack.owners() if key != BAD_SHARD]
    wait_for(lambda: all(stack.ledger.workers_of(key) for key in others), 30, "the other shards flowing")


def test_a_heartbeat_thread_that_fails_turns_health_red_and_its_shards_move(
        moto_server: MotoServer, kinesalite: NodeEmulator) -> None:
    """A permanent store error (AccessDenied on the row's UpdateItem) escapes the heartbeat: a critical failure."""
    stack = Stack(moto_server, kinesalite)
    proxy = DeniesUpdates(moto_server.endpoint_url)
    try:
        with proxy:
            exits: list[int] = []
            doomed = stack.add_agent("agent-1", exit=exits.append, agent_health_port=0,
                                     dynamodb_endpoint_url=proxy.endpoint_url)
            stack.add_agent("agent-2")
            wait_for(lambda: len(stack.owners()) == 3 and None not in stack.owners().values(), 30, "leases owned")
            wait_for(lambda: "agent-1" in stack.owners().values(), 30, "agent-1 holding a lease")
            assert doomed.health is not None
            url = f"http://127.0.0.1:{doomed.health.port}/healthz"
            assert httpx.get(url, timeout=5).status_code == 200
            proxy.denying = True
            denied = time.monotonic()
            red = wait_for(lambda: httpx.get(url, timeout=5).status_code == 503, 10, "agent-1's health red")
            wait_for(lambda: exits == [EXIT_GAVE_UP], 10, "agent-1 giving up its leases and exiting")
            moved = wait_for(lambda: "agent-1" not in stack.owners().values(), 30, "agent-1's leases elsewhere")
            interval = doomed.settings.effective_heartbeat_interval_millis / 1000
            failover = doomed.settings.failover_time_millis / 1000
            print(f"\nheartbeat thread failing: health red after {red:.2f} s, leases elsewhere after "
                  f"{time.monotonic() - denied:.1f} s")
            assert red <= 3 * interval
            assert moved <= failover + 5
    finally:
        stack.close()


class DeniesUpdates(FaultyProxy):
    """Answers UpdateItem with AccessDenied while `denying` (the role lost dynamodb:UpdateItem)."""

    denying = False

    def _next(self, target: str) -> Fault | None:
        if self.denying and target.endswith(".UpdateItem"):
            return Fault(400, "AccessDeniedException")
        return super()._next(target)


class ThreadDeath(BaseException):
    """What no `except Exception` catches (a `sys.exit()` in user code, say): the shard's thread ends."""


class DiesOn(PoisonOn):
    """A ledger processor whose first batch of BAD_SHARD ends its thread (once per test)."""

    died = False

    def process_records(self, records: list[Record], checkpointer: Checkpointer,
                        millis_behind_latest: int | None) -> None:
        if self.shard == BAD_SHARD and records and not DiesOn.died:
            DiesOn.died = True
            raise ThreadDeath("the shard thread ends here")
        LedgerProcessor.process_records(self, records, checkpointer, millis_behind_latest)


class HangsOn(DiesOn):
    """A ledger processor whose first batch of BAD_SHARD hangs (a sink that never answers) until `release` is set."""

    release = threading.Event()

    def process_records(self, records: list[Record], checkpointer: Checkpointer,
                        millis_behind_latest: int | None) -> None:
        if self.shard == BAD_SHARD and records and not HangsOn.died:
            HangsOn.died = True
            HangsOn.release.wait(60)
            return
        LedgerProcessor.process_records(self, records, checkpointer, millis_behind_latest)


def _health(agent: Agent) -> tuple[int, str]:
    assert agent.health is not None
    answer = httpx.get(f"http://127.0.0.1:{agent.health.port}/healthz", timeout=5)
    return answer.status_code, answer.json()["detail"]


def _metrics(agent: Agent) -> str:
    assert agent.health is not None
    return httpx.get(f"http://127.0.0.1:{agent.health.port}/metrics", timeout=5).text


@pytest.mark.parametrize("kind", [DiesOn, HangsOn], ids=["thread dies", "processor hangs"])
def test_a_held_lease_whose_worker_makes_no_progress_turns_health_red_and_is_given_back(
        stack: Stack, kind: type[DiesOn]) -> None:
    """Issue 30: /healthz stayed green while shard threads were dead, and the agent kept their leases for good."""
    kind.died = False
    HangsOn.release.clear()
    try:
        agent = stack.add_agent("agent-1", kind=kind, agent_health_port=0)
        wait_for(lambda: set(stack.owners().values()) == {"agent-1"} and len(stack.owners()) == 3, 30,
                 "agent-1 holds every lease")
        assert _health(agent)[0] == 200
        stack.produce(60, "s")
        wait_for(lambda: kind.died, 30, "the shard's worker stopped making progress")
        stopped = time.monotonic()
        bounds = agent.stalls.bounds
        if kind is HangsOn:  # a reader that still runs: red from 3 intervals until 3 failover times more
            red = wait_for(lambda: _health(agent)[0] == 503, bounds.red_after + 2, "health red")
            assert BAD_SHARD in _health(agent)[1] and agent.stalls.given_up == 0
        wait_for(lambda: agent.stalls.given_up == 1, bounds.give_up_after + 2, "the lease given back")
        given = time.monotonic() - stopped
        print(f"\n{kind.__name__}: given back after {given:.2f} s (bounds {bounds.red_after:.1f} / "
              f"{bounds.give_up_after:.1f} s){f', red after {red:.2f} s' if kind is HangsOn else ''}")
        assert "shardherd_leases_given_up_total 1.0" in _metrics(agent)
        if kind is DiesOn:  # a dead thread cannot be restarted: given back at the red bound
            assert given <= bounds.red_after + 1.0
        else:
            assert bounds.red_after < given <= bounds.give_up_after + 1.0
        stack.add_agent("agent-2")
        wait_for(stack.all_delivered, 60, "every record delivered (the shard read again)")
        wait_for(lambda: _health(agent)[0] == 200, 10, "health green once nothing unread is held")
    finally:
        HangsOn.release.set()


def test_a_one_shot_exception_in_a_shard_thread_is_survived_and_health_stays_green(stack: Stack) -> None:
    """The fault matrix's injection, once (tests/chaos/inject.py): the worker goes on, nothing is given back."""
    agent = stack.add_agent("agent-1", agent_health_port=0)
    wait_for(lambda: set(stack.owners().values()) == {"agent-1"} and len(stack.owners()) == 3, 30,
             "agent-1 holds every lease")
    stack.produce(30, "x")
    wait_for(stack.all_delivered, 30, "the first records delivered")
    hit = [thread.name for thread in targets("shard-shardId") if raise_in(thread)]
    assert len(hit) == 3
    time.sleep(agent.stalls.bounds.red_after + 0.5)
    stack.produce(30, "y")
    wait_for(stack.all_delivered, 30, "records after the raise delivered")
    assert set(stack.owners().values()) == {"agent-1"} and agent.stalls.given_up == 0
    assert _health(agent)[0] == 200


class ForgetsShardEnd(LedgerProcessor):
    """A ledger processor whose `shard_ended` returns twice without checkpointing SHARD_END, then checkpoints it."""

    calls = 0

    def shard_ended(self, shard_id: str, checkpointer: Checkpointer) -> None:
        ForgetsShardEnd.calls += 1
        if ForgetsShardEnd.calls > 2:
            super().shard_ended(shard_id, checkpointer)


def test_a_shard_end_without_its_checkpoint_is_asked_again_visibly_until_stored(
        stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 35: a processor that does not checkpoint SHARD_END kept its lease with nothing processing it, silently."""
    with caplog.at_level(logging.ERROR):
        agent = stack.add_agent("agent-1", kind=ForgetsShardEnd, agent_health_port=0)
        wait_for(lambda: set(stack.owners().values()) == {"agent-1"} and len(stack.owners()) == 3, 30,
                 "agent-1 holds every lease")
        parent = BAD_SHARD
        description = stack.kinesis.describe_stream(StreamName=stack.app)["StreamDescription"]
        hash_range = next(s["HashKeyRange"] for s in description["Shards"] if s["ShardId"] == parent)
        middle = (int(hash_range["StartingHashKey"]) + int(hash_range["EndingHashKey"])) // 2
        stack.kinesis.split_shard(StreamName=stack.app, ShardToSplit=parent, NewStartingHashKey=str(middle))
        wait_for(lambda: parent in agent.progress.failing(), 30, "the ended shard shown stuck")
        failing = agent.progress.failing()[parent]
        assert failing.last_error.startswith("ShardEndNotCheckpointed")
        assert agent.health is not None
        metrics = httpx.get(f"http://127.0.0.1:{agent.health.port}/metrics", timeout=5).text
        assert f'shardherd_shard_failing_batch_seconds{{lease="{parent}"}}' in metrics
        # Asked again after 1 s, then 2 s: the third call stores SHARD_END and the children follow.
        wait_for(lambda: stack.checkpoints().get(parent) == "SHARD_END", 30, "SHARD_END stored on a later attempt")
        wait_for(lambda: parent not in agent.progress.failing(), 10, "the shard no longer stuck")
    assert ForgetsShardEnd.calls == 3
    lines = [record for record in caplog.records if "did not store SHARD_END" in record.getMessage()]
    assert len(lines) == 2 and all(record.exc_info is None for record in lines)  # one line per attempt


def test_reads_whose_retries_run_out_are_reopened_not_counted_as_failed_attempts(
        moto_server: MotoServer, kinesalite: NodeEmulator) -> None:
    """Reads that keep failing are the stall watch's to judge (agent/stall_watch.py), not an attempt count's.

    Before, each time the reader's retries ran out was a failed attempt of the shard: its backoff counted as
    progress (so in a fleet-wide outage the worker stopped reporting its stalled leases and the leader's verdict
    turned), and after 3 the shard worker gave the lease back itself, whatever the verdict. With Kinesis calls'
    deadlines (agent/read_deadline.py) the retries run out within a minute: the 5-minute blackhole cell churned.
    Here every Kinesis call answers 500 for two thirds of the failing-read bound (1.5 s: the stall watch gives a lease
    whose reads only fail back at red, 2.3 s), the reader's retries running out at once: no attempt is counted,
    nothing is given back, and every record is delivered after the heal. About 10 s.
    """
    with ChaosProxy(kinesalite.endpoint_url) as proxy:
        stack = Stack(moto_server, kinesalite, kinesis_endpoint_url=proxy.endpoint_url)
        try:
            limits = replace(FAST_READS, retry_attempts=2, retry_base_delay=0.01, retry_max_delay=0.02)
            agent = Agent(stack.settings("agent-1"), lambda: LedgerProcessor(stack.ledger, "agent-1"),
                          limits=limits).start()
            stack.agents["agent-1"] = agent
            stack.wait_owned("agent-1", 30)
            stack.produce(30, "a")
            wait_for(stack.all_delivered, 30, "the first records delivered")
            proxy.set(Chaos(reply=INTERNAL_ERROR))
            time.sleep(agent.stalls.bounds.red_after * 2 / 3)
            proxy.set(CALM)
            stack.produce(30, "b")
            wait_for(stack.all_delivered, 30, "every record delivered after the heal")
            keys = [key for key in stack.owners()]
            assert [progress.failures for progress in agent.progress.snapshot(keys).values()] == [0] * len(keys)
            assert agent.stalls.given_up == 0 and stack.refused("agent-1") == {}
            assert set(stack.owners().values()) == {"agent-1"}
        finally:
            proxy.set(CALM)
            stack.close()


class CheckpointsLate(LedgerProcessor):
    """BAD_SHARD's first batch is ledgered, and checkpointed only once the shard's next worker here initializes.

    The next worker's `initialize` then waits for that checkpoint, so a worker that started from the row as it was
    before the checkpoint delivers records the checkpoint already covers. The first batch waits 6 s at most (a next
    worker that waits for this one's end never initializes before; by then the lease is held again).
    """

    holding = threading.Event()  # the first batch is ledgered, its checkpoint not yet asked for
    successor = threading.Event()  # a later worker of BAD_SHARD initializes
    stored: list[tuple[int, tuple[int, int]]] = []  # the ledger's length once that checkpoint returned, its position

    def initialize(self, shard_id: str, start: Checkpoint) -> None:
        super().initialize(shard_id, start)
        self.shard = shard_id
        if shard_id == BAD_SHARD and CheckpointsLate.holding.is_set():
            CheckpointsLate.successor.set()
            wait_for(lambda: bool(CheckpointsLate.stored), 10, "the previous worker's late checkpoint")

    def process_records(self, records: list[Record], checkpointer: Checkpointer,
                        millis_behind_latest: int | None) -> None:
        if self.shard != BAD_SHARD or not records or CheckpointsLate.holding.is_set():
            super().process_records(records, checkpointer, millis_behind_latest)
            return
        self.ledger.add(self.worker, records)
        CheckpointsLate.holding.set()
        CheckpointsLate.successor.wait(6)
        checkpointer.checkpoint(records[-1])
        CheckpointsLate.stored.append((len(self.ledger.entries), (int(records[-1].sequence_number),
                                                                  records[-1].sub_sequence_number)))

    shard = ""


def test_a_lease_taken_up_again_while_its_batch_is_checkpointed_starts_after_that_checkpoint(
        moto_server: MotoServer, kinesalite: NodeEmulator) -> None:
    """Issue 30: under DynamoDB 5xx a run redelivered 11 records a checkpoint already covered.

    The agent fenced itself while a batch of a shard was being checkpointed, took the lease up again once the store
    answered, and started a new worker from the row it read then; the old worker's checkpoint landed afterwards (the
    keeper held the lease again, so it was accepted) and the new worker delivered the batch again. Here the old
    worker's checkpoint is held back until the new worker initializes. A new worker waits until the old one ended
    and starts after its checkpoint: no record is delivered again after a checkpoint covered it. About 10 s.
    """
    CheckpointsLate.holding.clear()
    CheckpointsLate.successor.clear()
    CheckpointsLate.stored.clear()
    with ChaosProxy(moto_server.endpoint_url) as proxy:
        stack = Stack(moto_server, kinesalite)
        try:
            stack.add_agent("agent-1", kind=CheckpointsLate, dynamodb_endpoint_url=proxy.endpoint_url)
            stack.wait_owned("agent-1", 30)
            stack.produce(60, "a")
            wait_for(CheckpointsLate.holding.is_set, 30, "a batch of the shard waiting for its checkpoint")
            agent = stack.agents["agent-1"]
            proxy.set(Chaos(reply=INTERNAL_ERROR))  # every store call fails: the agent fences its leases
            wait_for(lambda: BAD_SHARD not in agent.keeper.held(), 10, "the shard's lease fenced")
            proxy.set(CALM)
            wait_for(lambda: bool(CheckpointsLate.stored), 15, "the held-back checkpoint stored")
            stack.produce(30, "b")
            wait_for(stack.all_delivered, 30, "every record delivered")
        finally:
            proxy.set(CALM)
            stack.close()
    stored_at, position = CheckpointsLate.stored[0]
    later = [(int(sequence), sub) for shard, sequence, sub, _, _ in stack.ledger.entries[stored_at:]
             if shard == BAD_SHARD]
    assert later, "the shard read on after the checkpoint"
    assert not [p for p in later if p <= position], f"delivered again after checkpoint {position}: {later}"
