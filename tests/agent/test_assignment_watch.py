"""The agent's watch over real HTTP: it finds the leading replica in its list, carries news, and its going away
is noticed by the leader at once (decision 0010).

Two coordinator replicas share one store (DynamoDB on moto server); each serves its real operator API with uvicorn
on 127.0.0.1. Only the leader answers the long-poll; the other answers 409.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from shardherd.agent.assignment_watch import AssignmentWatch
from shardherd.coordinator.assignment_feed import DROPPED, JOINED, NEWS
from shardherd.services.api import create_app
from shardherd.services.api.server import ApiServer
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.clock import SystemClock
from shardherd.shared.config import load_settings
from tests.services.harness import Replica
from tests.support.stores import make_store
from tests.support.waiting import wait_for


class Keeper:
    """What the watch tells (a lease keeper's side)."""

    def __init__(self) -> None:
        self.told: list[dict[str, str]] = []
        self.row = (7, 1_700_000_000)  # the row the agent last wrote: each request names it

    def tell(self, leases: dict[str, str]) -> None:
        self.told.append(dict(leases))

    def discover_soon(self) -> None:
        pass

    def last_beat(self) -> tuple[int, int] | None:
        return self.row


@pytest.fixture
def replicas(moto_server: MotoServer) -> Iterator[tuple[Replica, Replica, list[str]]]:
    store = make_store("dynamodb", moto_url=moto_server.endpoint_url)
    # A 60 s failover holds a long-poll for the agent's whole 20 s wait: only a short request names a row sooner.
    leader = Replica(store, shards=2, replica_id="coord-a", failover_time_millis=60_000)
    other = Replica(store, shards=2, replica_id="coord-b", clock=leader.clock, failover_time_millis=60_000)
    leader.join("w1")
    leader.step(3)  # coord-a takes the lock and gives w1 both leases
    other.lock.tick()
    assert leader.lock.is_leader() and not other.lock.is_leader()
    servers = [ApiServer(create_app(replica.context), "127.0.0.1", 0).start() for replica in (other, leader)]
    yield leader, other, [server.url for server in servers]
    leader.loop.feed.stand_down()  # waiting requests end (409) instead of at the end of their wait
    for server in servers:
        server.stop()
    store.close()


def test_the_watch_finds_the_leader_carries_news_and_its_end_is_signalled(
        replicas: tuple[Replica, Replica, list[str]]) -> None:
    leader, _, urls = replicas
    settings = load_settings(application_name="api-test", worker_id="w1", coordinator_url=",".join(urls))
    keeper = Keeper()
    heard: list[tuple[bool, frozenset[str]]] = []
    epoch = leader.lock.epoch()
    assert epoch is not None  # the leader's verdicts of its last run: the fleet stalls (decision 0039), and one of
    leases = leader.store.scan_leases().leases  # w1's leases stalls at every owner, as does another's (0043)
    stalled = min(lease.lease_key for lease in leases)
    leader.loop.feed.observe(epoch, leases, fleet_stalls=True, shard_stalls=frozenset({stalled, "not-w1s"}))
    watch = AssignmentWatch(settings, keeper, SystemClock(),
                            fleet_verdict=lambda fleet, shards: heard.append((fleet, shards))).start()  # first: 409
    try:
        wait_for(lambda: bool(keeper.told), 10, "an answer from the leading replica")
        assert set(keeper.told[-1].values()) == {"owns"} and len(keeper.told[-1]) == 2
        assert heard == [(True, frozenset({stalled}))]  # each answer's verdicts are heard, only w1's leases
        wait_for(lambda: leader.loop.feed.on_channel("w1"), 10, "w1 on the leader's channel")
        assert (("w1", JOINED)) in leader.loop.feed.take_signals()
        assert leader.loop.feed.beats()["w1"][:2] == (7, 1_700_000_000)  # the leader knows the row without a scan
        watch.news()
        wait_for(lambda: ("w1", NEWS) in leader.loop.feed.take_signals(), 10, "the news at the leader")
        # A new row is named at once (the long-poll waits up to 20 s), and is no news: the leader does not scan.
        keeper.row = (8, 1_700_000_004)
        watch.beat()
        wait_for(lambda: leader.loop.feed.beats()["w1"][:2] == keeper.row, 10, "the new row named to the leader")
        assert ("w1", NEWS) not in leader.loop.feed.take_signals()
    finally:
        leader.loop.feed.stand_down()  # the waiting request ends now, so the watch stops at once
        watch.stop()


def test_a_waiting_request_whose_client_goes_away_is_signalled_at_once(
        replicas: tuple[Replica, Replica, list[str]]) -> None:
    """A killed agent's socket closes: the leader hears of it now, not when the long-poll would have ended."""
    leader, _, urls = replicas
    host, port = urlsplit(urls[1]).hostname, urlsplit(urls[1]).port
    assert host is not None and port is not None
    position = leader.loop.feed.position("w1")
    with socket.create_connection((host, port)) as client:
        client.sendall(f"GET /v1/workers/w1/assignments/changes?feed={position.feed}&after={position.version}"
                       f"&wait=60 HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        wait_for(lambda: leader.loop.feed.on_channel("w1"), 10, "the request waiting")
        assert leader.loop.feed.take_signals() == [("w1", JOINED)]
    wait_for(lambda: ("w1", DROPPED) in leader.loop.feed.take_signals(), 5, "the dropped request signalled")


def test_a_refused_token_is_logged_as_an_error_and_a_rotated_one_is_picked_up_without_a_restart(
        moto_server: MotoServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The coordinator rotated the read token before the agent's copy of the Secret followed (decision 0021)."""
    served, held = tmp_path / "served", tmp_path / "held"
    served.write_text("new-read-token-0123456789\n")
    held.write_text("old-read-token-0123456789\n")
    store = make_store("dynamodb", moto_url=moto_server.endpoint_url)
    leader = Replica(store, shards=2, api_read_token_file=str(served))
    leader.join("w1")
    leader.step(3)
    server = ApiServer(create_app(leader.context), "127.0.0.1", 0).start()
    settings = load_settings(application_name="api-test", worker_id="w1", coordinator_url=server.url,
                             api_read_token_file=str(held))
    keeper = Keeper()
    watch = AssignmentWatch(settings, keeper, SystemClock())
    try:
        with caplog.at_level(logging.ERROR, logger="shardherd.agent.assignment_watch"):
            watch.start()
            wait_for(lambda: any("refused this agent's token (HTTP 401" in r.message for r in caplog.records), 10,
                     "the refusal logged as an error")
        assert not keeper.told and not leader.loop.feed.on_channel("w1")
        held.write_text("new-read-token-0123456789\n")  # the agent's copy of the Secret follows
        wait_for(lambda: bool(keeper.told), 15, "an answer with the rotated token, no restart")
        wait_for(lambda: leader.loop.feed.on_channel("w1"), 10, "w1 on the leader's channel")
    finally:
        leader.loop.feed.stand_down()
        watch.stop()
        server.stop()
        store.close()


def test_stop_returns_at_once_while_the_long_poll_and_the_news_thread_wait(
        replicas: tuple[Replica, Replica, list[str]]) -> None:
    """Every agent stops its watch on shutdown: the new process of a restart (or a drained pod's exit) waits on it.

    The news thread waited for news in 1 s slices and looked at the stop only between them.
    """
    leader, _, urls = replicas
    settings = load_settings(application_name="api-test", worker_id="w1", coordinator_url=",".join(urls))
    keeper = Keeper()
    watch = AssignmentWatch(settings, keeper, SystemClock()).start()
    wait_for(lambda: leader.loop.feed.on_channel("w1"), 10, "the long-poll waiting at the leader")
    keeper.row = (8, 1_700_000_004)
    watch.beat()  # the news thread sends it, then waits for the next news
    wait_for(lambda: leader.loop.feed.beats()["w1"][:2] == keeper.row, 10, "the row named to the leader")
    started = time.monotonic()
    watch.stop()
    assert time.monotonic() - started < 0.3
