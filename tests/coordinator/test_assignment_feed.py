"""The leader's assignment feed: versions move only for workers whose leases changed; long-polls wake or time out."""

from __future__ import annotations

import asyncio
import threading

import pytest

from shardherd.coordinator.assignment_feed import (
    DROPPED,
    FORGET_SECONDS,
    JOINED,
    NEWS,
    REPOLL_GRACE_SECONDS,
    AssignmentFeed,
    NotLeading,
)
from shardherd.shared.assignment_channel import HANDS_OFF, OWNS, RECEIVES, relations
from shardherd.shared.clock import ManualClock
from shardherd.shared.lease import Lease


def test_relations_name_owners_receivers_and_handing_off_workers() -> None:
    leases = [Lease("a", lease_owner="w1"), Lease("b", lease_owner="w2", checkpoint_owner="w1"), Lease("c")]
    assert relations(leases) == {"w1": {"a": OWNS, "b": HANDS_OFF}, "w2": {"b": RECEIVES}}


def test_only_workers_whose_leases_changed_move_and_a_new_term_is_a_new_feed() -> None:
    feed = AssignmentFeed()
    with pytest.raises(NotLeading):
        feed.position("w1")
    feed.observe(3, [Lease("a", lease_owner="w1"), Lease("b", lease_owner="w2")])
    first = {worker: feed.position(worker) for worker in ("w1", "w2")}
    feed.observe(3, [Lease("a", lease_owner="w1", lease_counter=9), Lease("b", lease_owner="w1")])
    assert feed.position("w1").version == first["w1"].version + 1
    assert feed.position("w1").leases == {"a": OWNS, "b": OWNS}
    assert feed.position("w2").version == first["w2"].version + 1 and feed.position("w2").leases == {}
    feed.observe(3, [Lease("a", lease_owner="w1", lease_counter=10), Lease("b", lease_owner="w1")])
    assert feed.position("w1").version == first["w1"].version + 1  # a counter or checkpoint is no change
    feed.observe(4, [Lease("a", lease_owner="w1")])
    assert feed.position("w1").feed != first["w1"].feed
    feed.stand_down()
    with pytest.raises(NotLeading):
        feed.position("w1")


def test_a_waiting_request_wakes_on_a_change_from_another_thread_and_times_out_otherwise() -> None:
    feed = AssignmentFeed()
    feed.observe(1, [Lease("a", lease_owner="w1")])
    start = feed.position("w1")

    async def scenario() -> None:
        quiet = await feed.wait("w1", start.feed, start.version, 0.2)
        assert quiet == start
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, lambda: threading.Thread(
            target=feed.observe, args=(1, [Lease("a", lease_owner="w1"), Lease("b", lease_owner="w1")])).start())
        moved = await asyncio.wait_for(feed.wait("w1", start.feed, start.version, 30), 5)
        assert moved.version == start.version + 1 and moved.leases == {"a": OWNS, "b": OWNS}
        stale = await feed.wait("w1", "another-feed", 99, 30)  # another term's position: answered at once
        assert stale.feed == start.feed
        loop.call_later(0.1, feed.stand_down)
        with pytest.raises(NotLeading):
            await asyncio.wait_for(feed.wait("w1", moved.feed, moved.version, 30), 5)

    asyncio.run(scenario())


def test_a_turning_fleet_verdict_answers_every_listener_at_once_without_moving_a_version() -> None:
    """Agents give back leases whose reads only fail 2 failover times after red (agent/stall_watch.py): in a shared
    outage the leader's verdict must reach them before that, not with their next answer a heartbeat later."""
    feed = AssignmentFeed()
    leases = [Lease("a", lease_owner="w1"), Lease("b", lease_owner="w2")]
    feed.observe(1, leases)
    start = {worker: feed.position(worker) for worker in ("w1", "w2")}

    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        began = loop.time()
        loop.call_later(0.1, lambda: threading.Thread(target=feed.observe, args=(1, leases, True)).start())
        answers = await asyncio.wait_for(asyncio.gather(
            *(feed.wait(worker, start[worker].feed, start[worker].version, 30) for worker in ("w1", "w2"))), 5)
        assert [answer.fleet_stalls for answer in answers] == [True, True]
        assert [answer.version for answer in answers] == [start["w1"].version, start["w2"].version]
        quiet = await feed.wait("w1", start["w1"].feed, start["w1"].version, 0.2)  # the same verdict: no wake
        assert quiet.fleet_stalls
        return [loop.time() - began]

    assert asyncio.run(scenario())[0] < 2.0


def test_presence_follows_requests_and_joins_drops_and_news_are_signalled_once() -> None:
    clock = ManualClock()
    feed = AssignmentFeed(clock)
    feed.observe(1, [Lease("a", lease_owner="w1")])
    start = feed.position("w1")
    assert not feed.on_channel("w1") and feed.take_signals() == []

    async def scenario() -> None:
        waiting = asyncio.ensure_future(feed.wait("w1", start.feed, start.version, 30))
        await asyncio.sleep(0.05)
        assert feed.on_channel("w1") and feed.wakeup.is_set()
        assert feed.take_signals() == [("w1", JOINED)] and not feed.wakeup.is_set()
        waiting.cancel()  # what the endpoint does when the agent's connection closes
        await asyncio.gather(waiting, return_exceptions=True)
        answered = await feed.wait("w1", "old-feed", 0, 30)  # another position: answered at once, not dropped
        assert answered.feed == start.feed

    asyncio.run(scenario())
    assert feed.take_signals() == [("w1", DROPPED)]
    assert feed.on_channel("w1")  # the watch asks again at once after an answer
    clock.advance(REPOLL_GRACE_SECONDS + 0.1)
    assert not feed.on_channel("w1")  # no request for longer than that: off the channel
    feed.signal("w1", NEWS)
    assert feed.wakeup.is_set() and feed.take_signals() == [("w1", NEWS)]
    clock.advance(FORGET_SECONDS)
    feed.take_signals()  # long gone: forgotten, so the map of who listens stays bounded
    feed.connect("w1")
    assert feed.take_signals() == [("w1", JOINED)]


def test_a_listening_request_is_held_at_most_a_heartbeat_so_a_frozen_agent_leaves_the_channel() -> None:
    """A frozen agent's socket stays open: its request must not count as presence for the whole wait it asked for."""
    clock = ManualClock()
    feed = AssignmentFeed(clock, hold=0.2)
    feed.observe(1, [Lease("a", lease_owner="w1")])
    start = feed.position("w1")

    async def scenario() -> float:
        began = asyncio.get_running_loop().time()
        answer = await asyncio.wait_for(feed.wait("w1", start.feed, start.version, 30), 5)
        assert answer == start  # unchanged: answered when the hold ended, not after the 30 s asked for
        anonymous = asyncio.ensure_future(feed.wait("w1", start.feed, start.version, 0.6, listen=False))
        await asyncio.sleep(0.4)
        assert not anonymous.done()  # the hold is about presence: an anonymous wait is neither held nor presence
        await anonymous
        return asyncio.get_running_loop().time() - began

    assert asyncio.run(scenario()) < 2.0
    assert feed.on_channel("w1")  # a live agent asks again at once
    clock.advance(REPOLL_GRACE_SECONDS + 0.1)
    assert not feed.on_channel("w1")  # a frozen one does not: the leader scans and judges its row


def test_an_agent_that_listens_but_no_longer_heartbeats_leaves_the_channel() -> None:
    """Fault matrix, "DynamoDB hang, agent": its store calls hung, its long-polls went on naming the same row, and the
    leader, seeing it on the channel, never scanned: its leases were not moved for the whole fault."""
    clock = ManualClock()
    feed = AssignmentFeed(clock, hold=1.0)
    for beat in range(1, 6):  # a live agent: a new row named every heartbeat
        feed.connect("w1")
        feed.report_beat("w1", beat, 100 + beat)
        feed.disconnect("w1", dropped=False)
        clock.advance(1.0)
        assert feed.on_channel("w1")
    for _ in range(3):  # its heartbeats hang; it keeps asking, naming its last row
        feed.connect("w1")
        feed.report_beat("w1", 5, 105)
        feed.disconnect("w1", dropped=False)
        clock.advance(1.0)
    assert not feed.on_channel("w1")  # row unchanged for hold + grace: the leader scans and judges it
    feed.report_beat("w1", 6, 106)
    assert feed.on_channel("w1")


def test_a_row_named_by_requests_counts_from_the_first_request_that_named_it() -> None:
    clock = ManualClock()
    feed = AssignmentFeed(clock)
    feed.report_beat("w1", 7, 1000)
    clock.advance(3.0)
    feed.report_beat("w1", 7, 1000)  # the same row again: still unchanged since the first naming
    assert feed.beats() == {"w1": (7, 1000, 1000.0)}
    feed.report_beat("w1", 8, 1004)
    assert feed.beats() == {"w1": (8, 1004, 1003.0)}
