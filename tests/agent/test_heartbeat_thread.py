"""An agent's heartbeat runs on its own thread: a slow store call of the keeper (discovery) cannot starve it.

Real store (each backend), real threads and clock, a 1 s failover (0.4 s derived heartbeat, fencing after 0.9 s).
"""

from __future__ import annotations

import threading
import time
from typing import Any, cast

from shardherd.agent.runtime import Agent
from shardherd.shared.config import load_settings
from shardherd.shared.store import LeaseStore
from tests.support.stores import worker_record
from tests.support.waiting import wait_for

SLOW_SECONDS = 2.5  # well past the failover: a heartbeat waiting behind this call would fence the agent


class SlowDiscovery:
    """A real store whose owner-index query takes SLOW_SECONDS once `slow` is set (a loaded store, say)."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.slow = threading.Event()
        self.stalled = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def list_owned_keys(self, worker: str) -> Any:
        if self.slow.is_set():
            self.stalled.set()
            time.sleep(SLOW_SECONDS)
        return self.store.list_owned_keys(worker)


def _no_processor() -> Any:
    raise AssertionError("no lease is ever held here")


def test_heartbeats_continue_while_a_keeper_store_call_is_slow(store: LeaseStore) -> None:
    settings = load_settings(worker_id="w1", application_name="heartbeat-apart", stream_name="orders",
                             kinesis_endpoint_url="http://127.0.0.1:9", disable_worker_metrics=True,
                             failover_time_millis=1000, discovery_interval_millis=200)
    slow = SlowDiscovery(store)
    agent = Agent(settings, _no_processor, store=cast(LeaseStore, slow)).start()
    try:
        wait_for(agent.keeper.is_live, 10, "the first heartbeat")
        slow.slow.set()
        assert slow.stalled.wait(5)
        before = worker_record(store, "w1")
        assert before is not None
        started = time.monotonic()
        dead = []
        while time.monotonic() - started < SLOW_SECONDS - 0.2:
            if not agent.keeper.is_live():
                dead.append(round(time.monotonic() - started, 2))
            time.sleep(0.05)
        after = worker_record(store, "w1")
        assert after is not None
        assert dead == []  # never past the fencing limit while discovery was stuck
        assert after.heartbeat >= before.heartbeat + 3  # a heartbeat every 0.4 s meanwhile
    finally:
        slow.slow.clear()
        agent.stop(drain=False)
