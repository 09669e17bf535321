"""The Spark agent's checkpoints after a batch: at once, and a shard under handoff released without waiting for others.

No JVM: the agent's sink side (`begin_write`, `commit_progress`) on a real store and a virtual clock.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, cast

from shardherd.agent.read_spec import StartPosition
from shardherd.agent.spark.batch_ends import BatchEnd, record_end
from shardherd.agent.spark.driver import SparkAgent
from shardherd.agent.spark.offsets import Caps, ShardPlan
from shardherd.shared.checkpoint import TRIM_HORIZON, Checkpoint
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from shardherd.shared.lease import new_lease
from shardherd.shared.store import LeaseStore, Outcome

FIRST, SECOND = "shardId-000000000000", "shardId-000000000001"


def _plan(key: str, start: Checkpoint, tenure: str, number: int) -> ShardPlan:
    return ShardPlan(key, StartPosition.after(start), Caps(), tenure, "r", number)


def _read(store: LeaseStore, plan: ShardPlan, end: str) -> ShardPlan:
    """Record where the executors' read of `plan` stopped, as its first read does."""
    record_end(store, BatchEnd(plan.tenure, plan.run, plan.number, Checkpoint.at(end), 5, 50, caught_up=True))
    return plan


class CallLog:
    """A real store that notes the order of checkpoints and handoff completions (everything else passes through)."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.calls: list[tuple[str, str]] = []
        self.first_out = threading.Event()  # FIRST's checkpoint has been sent
        self.released = threading.Event()  # SECOND's handoff completed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def checkpoint(self, lease_key: str, worker: str, checkpoint: Checkpoint, **extra: Any) -> Outcome:
        """SECOND's checkpoint waits until FIRST's is out; FIRST's until SECOND was released: both only if at once."""
        self.calls.append(("checkpoint", lease_key))
        if lease_key == FIRST:
            self.first_out.set()
            assert self.released.wait(10), "the handoff waited for the batch's other checkpoint"
        else:
            assert self.first_out.wait(10), "the batch's checkpoints were not sent at once"
        outcome = self.store.checkpoint(lease_key, worker, checkpoint, **extra)
        if outcome.lease is not None and outcome.lease.lease_owner != worker and outcome.lease.checkpoint_owner is None:
            self.released.set()  # the final checkpoint completed the handoff in the same write
        return outcome

    def complete_handoff(self, lease_key: str, checkpoint_owner: str) -> Outcome:
        self.calls.append(("complete_handoff", lease_key))
        outcome = self.store.complete_handoff(lease_key, checkpoint_owner)
        self.released.set()  # the handoff completed while the other shard's checkpoint was still out
        return outcome


def test_a_shard_under_handoff_is_released_with_its_checkpoint_while_the_batch_s_others_are_still_out(
        store: LeaseStore, tmp_path: Path) -> None:
    clock = ManualClock()
    calls = CallLog(store)
    settings = load_settings(worker_id="w1", application_name="handoff-order", stream_name="orders",
                             kinesis_endpoint_url="http://127.0.0.1:9", disable_worker_metrics=True)
    agent = SparkAgent(settings, channel=tmp_path, store=cast(LeaseStore, calls), clock=clock)
    try:
        for key in (FIRST, SECOND):
            store.create_lease(new_lease(key, TRIM_HORIZON))
            store.assign(key, "w1", None, None)
        agent.keeper.tick()
        assert set(agent.keeper.held()) == {FIRST, SECOND}
        views = agent.book.snapshot().shards
        plans = [_read(store, _plan(key, TRIM_HORIZON, views[key].tenure, 1), end)
                 for key, end in ((FIRST, "100"), (SECOND, "200"))]
        written = agent.begin_write(plans)
        assert written == plans

        assert store.start_handoff(SECOND, "w2", "w1").applied  # asked while the batch writes: it waits for it
        clock.advance(1.5)
        agent.keeper.tick()
        assert agent.book.is_handing_off(SECOND)
        assert store.get_lease(SECOND).checkpoint_owner == "w1"  # type: ignore[union-attr]

        calls.calls.clear()
        agent.commit_progress(7, written)
        assert agent.book.snapshot().shards[FIRST].checkpoint == Checkpoint.at("100")  # the next plan starts after it
        agent.await_checkpoints(10)  # stored in the background
        # One write stores SECOND's final checkpoint and hands it over: no separate completion round trip.
        assert sorted(calls.calls) == [("checkpoint", FIRST), ("checkpoint", SECOND)]
        assert SECOND not in agent.keeper.held() and not agent.book.is_handing_off(SECOND)
        second = store.get_lease(SECOND)
        assert second is not None and second.lease_owner == "w2" and second.checkpoint_owner is None
        assert second.checkpoint == Checkpoint.at("200")  # released only after the written end was stored
        assert store.get_lease(FIRST).checkpoint == Checkpoint.at("100")  # type: ignore[union-attr]
    finally:
        agent.stop(drain=False)


class SlowCheckpoints:
    """A real store whose checkpoints wait until the test lets them through (everything else passes through)."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.go = threading.Event()
        self.stored: list[Checkpoint] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def checkpoint(self, lease_key: str, worker: str, checkpoint: Checkpoint, **extra: Any) -> Outcome:
        assert self.go.wait(10), "the test never let the checkpoint through"
        outcome = self.store.checkpoint(lease_key, worker, checkpoint, **extra)
        self.stored.append(checkpoint)
        return outcome


def _holding_first(store: LeaseStore, agent_store: object, channel: Path,
                   clock: ManualClock) -> tuple[SparkAgent, tuple[ShardPlan, ShardPlan]]:
    """A driver w1 (stores through `agent_store`) holding FIRST, and two plans of it, one after the other."""
    settings = load_settings(worker_id="w1", application_name="checkpoint-order", stream_name="orders",
                             kinesis_endpoint_url="http://127.0.0.1:9", disable_worker_metrics=True)
    agent = SparkAgent(settings, channel=channel, store=cast(LeaseStore, agent_store), clock=clock)
    store.create_lease(new_lease(FIRST, TRIM_HORIZON))
    store.assign(FIRST, "w1", None, None)
    agent.keeper.tick()
    tenure = agent.book.snapshot().shards[FIRST].tenure
    return agent, (_plan(FIRST, TRIM_HORIZON, tenure, 1), _plan(FIRST, Checkpoint.at("100"), tenure, 2))


def test_the_next_plan_starts_after_a_written_batch_while_its_checkpoint_is_still_being_stored(
        store: LeaseStore, tmp_path: Path) -> None:
    slow = SlowCheckpoints(store)
    agent, (first, second) = _holding_first(store, slow, tmp_path, ManualClock())
    try:
        agent.commit_progress(1, agent.begin_write([_read(store, first, "100")]))  # returns while the checkpoint waits
        assert agent.book.snapshot().shards[FIRST].checkpoint == Checkpoint.at("100")
        assert store.get_lease(FIRST).checkpoint == TRIM_HORIZON  # type: ignore[union-attr]

        written = agent.begin_write([_read(store, second, "200")])
        committed = threading.Thread(target=agent.commit_progress, args=(2, written))
        committed.start()
        committed.join(0.3)
        assert committed.is_alive()  # the previous batch's checkpoint first: one shard's land in order
        slow.go.set()
        committed.join(10)
        agent.await_checkpoints(10)
        assert slow.stored == [Checkpoint.at("100"), Checkpoint.at("200")]
        assert store.get_lease(FIRST).checkpoint == Checkpoint.at("200")  # type: ignore[union-attr]
    finally:
        slow.go.set()
        agent.stop(drain=False)


def test_a_handoff_waiting_for_two_writes_is_handed_over_only_with_the_last_one_s_checkpoint(
        store: LeaseStore, tmp_path: Path) -> None:
    clock = ManualClock()
    agent, (first, second) = _holding_first(store, store, tmp_path, clock)
    try:
        assert agent.begin_write([first]) == [first]
        assert agent.begin_write([second]) == [second]  # the next batch writes while the first one's is not stored

        assert store.start_handoff(FIRST, "w2", "w1").applied
        clock.advance(1.5)
        agent.keeper.tick()
        assert agent.book.is_handing_off(FIRST)

        agent.commit_progress(1, [_read(store, first, "100")])
        agent.await_checkpoints(10)
        stored = store.get_lease(FIRST)
        assert stored is not None and stored.checkpoint == Checkpoint.at("100")
        assert (stored.lease_owner, stored.checkpoint_owner) == ("w2", "w1")  # still ours: a write is still out
        assert FIRST in agent.keeper.held()

        agent.commit_progress(2, [_read(store, second, "200")])
        agent.await_checkpoints(10)
        stored = store.get_lease(FIRST)
        assert stored is not None and stored.checkpoint == Checkpoint.at("200")
        assert (stored.lease_owner, stored.checkpoint_owner) == ("w2", None)
        assert FIRST not in agent.keeper.held()
    finally:
        agent.stop(drain=False)


def test_a_driver_frozen_past_its_failover_time_writes_no_row_of_its_leases_before_its_keeper_runs_again(
        store: LeaseStore, tmp_path: Path) -> None:
    clock = ManualClock()
    agent, (first, _) = _holding_first(store, store, tmp_path, clock)
    try:
        clock.advance(agent.settings.failover_time_millis / 1000)  # SIGSTOP for the failover time; no keeper tick
        assert FIRST in agent.keeper.held()  # the keeper has not fenced yet: only the time says the lease may be gone
        assert agent.begin_write([first]) == []  # the fault matrix saw 400 rows written twice without this
    finally:
        agent.stop(drain=False)
