"""Agent processes that learn of assignment changes from the coordinator's long-poll, on moto server and kinesalite.

The coordinator runs its real operator API on 127.0.0.1; each agent is a `shardherd agent` process with
`coordinator_url` set and its store calls metered (SHARDHERD_STORE_METER_DIR), so the test counts the owner-index
queries the agents really sent. While the coordinator answers, leases reach a new agent and move between agents with
no per-second index polling; with the coordinator gone, the agents keep processing and poll the index again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from tests.e2e.test_agent_processes import ProcessStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

# With the coordinator answering, agents query the index only every fallback interval (set long here).
FALLBACK_MILLIS = 60_000


class ChannelStack(ProcessStack):
    """ProcessStack whose agents long-poll the in-process coordinator and meter their store calls."""

    def __init__(self, moto: MotoServer, kinesalite: NodeEmulator, tmp: Path) -> None:
        super().__init__(moto, kinesalite, tmp / "ledger.txt", metrics=False)
        assert self.coordinator.api is not None
        self.meters = tmp / "meters"
        self.meters.mkdir()
        self.env.update({"SHARDHERD_COORDINATOR_URL": self.coordinator.api.url,
                         "SHARDHERD_DISCOVERY_FALLBACK_INTERVAL_MILLIS": str(FALLBACK_MILLIS),
                         "SHARDHERD_STORE_METER_DIR": str(self.meters)})

    def index_queries(self) -> int:
        """Owner-index queries all agent processes sent so far (their meters are dumped every 2 s)."""
        total = 0
        for path in self.meters.glob("agent-*.json"):
            rows = json.loads(path.read_text(encoding="utf-8"))
            total += sum(row["requests"] for row in rows if row["operation"] == "query")
        return total


@pytest.fixture
def channel(moto_server: MotoServer, kinesalite: NodeEmulator, tmp_path: Path) -> Iterator[ChannelStack]:
    stack = ChannelStack(moto_server, kinesalite, tmp_path)
    yield stack
    stack.close()


def test_agents_follow_the_coordinator_without_polling_and_keep_working_without_it(channel: ChannelStack) -> None:
    channel.start_agent("agent-1")
    wait_for(lambda: set(channel.owners().values()) == {"agent-1"}, 60, "agent-1 to hold every lease")
    channel.start_agent("agent-2")
    started = time.monotonic()
    wait_for(lambda: "agent-2" in channel.owners().values(), 60, "a lease to move to agent-2")
    channel.produce(300, "with-coordinator")
    wait_for(channel.all_delivered, 60, "records delivered")
    time.sleep(2.5)  # the agents' meters are dumped every 2 s
    elapsed = time.monotonic() - started
    queries = channel.index_queries()
    # Polling every 0.3 s (discovery_interval_millis) would be about 2 x 3.3 queries per second; the channel leaves
    # the first discovery per agent and the receivers' 1-per-interval looks while a handoff drains.
    assert queries < elapsed, (queries, elapsed)
    assert sum(channel.delivered().values()) >= len(channel.produced)

    channel.coordinator.stop()
    before = channel.index_queries()
    channel.produce(300, "without-coordinator")
    wait_for(channel.all_delivered, 60, "records delivered with the coordinator down")
    time.sleep(5)
    assert channel.index_queries() - before >= 2 * 5  # back to polling the index (every 0.3 s) per agent
    assert set(channel.owners().values()) == {"agent-1", "agent-2"}


def _quiet_ticks(stack: ChannelStack) -> int:
    """How many of the leader's newest runs in a row ticked on its view without scanning the store."""
    streak = 0
    for summary in reversed(stack.coordinator.loop.history.recent()):
        if summary.scanned or not summary.ok:
            break
        streak += 1
    return streak


def _reasons(stack: ChannelStack) -> list[str | None]:
    return [summary.scan_reason for summary in stack.coordinator.loop.history.recent()]


def test_the_leader_scans_rarely_while_agents_listen_yet_a_kill_or_a_drain_moves_leases_at_once(
        channel: ChannelStack) -> None:
    """Decision 0010 on real processes: kill -9 closes the agent's long-poll, SIGTERM sends its news."""
    for worker in ("agent-1", "agent-2", "agent-3"):
        channel.start_agent(worker)
    wait_for(lambda: set(channel.owners().values()) == {"agent-1", "agent-2", "agent-3"}, 60, "three busy agents")
    wait_for(lambda: _quiet_ticks(channel) >= 10, 60, "the leader ticking on its view (no scans)")

    victims = [key for key, owner in channel.owners().items() if owner == "agent-3"]
    killed = time.monotonic()
    channel.agents["agent-3"].kill()
    wait_for(lambda: all(channel.owners()[key] in ("agent-1", "agent-2") for key in victims), 30,
             "the killed agent's leases moved")
    failover = channel.coordinator.settings.failover_time_millis / 1000
    assert time.monotonic() - killed < failover + 3.0
    assert "dropped: agent-3" in _reasons(channel)

    wait_for(lambda: _quiet_ticks(channel) >= 10, 60, "the leader quiet again")
    leaving = [key for key, owner in channel.owners().items() if owner == "agent-2"]
    began = time.monotonic()
    channel.agents["agent-2"].terminate()  # drain: handoffs to agent-1
    wait_for(lambda: all(channel.owners()[key] == "agent-1" for key in leaving), 30, "the drained leases moved")
    assert time.monotonic() - began < failover  # not the full-scan interval (20 s) the leader waits when quiet
    assert "news: agent-2" in _reasons(channel)
