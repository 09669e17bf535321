"""The leader's per-lease verdict (coordinator/shard_stall.py, decision 0043) on the leader's clock: a lease whose
reads stalled at two workers within the window is the shard's fault, and stays so while its owner keeps stalling;
one worker stalling, a refusal without a stall behind it, or evidence past the window is no verdict. The feed then
tells each owner only its own shard-stalled leases, waking it when they change (no version moves)."""

from __future__ import annotations

import asyncio
import threading

from shardherd.coordinator.assignment_feed import AssignmentFeed
from shardherd.coordinator.shard_stall import MIN_WORKERS, ShardStalls, window_for
from shardherd.shared.checkpoint import SHARD_END
from shardherd.shared.config import load_settings
from shardherd.shared.lease import Lease
from shardherd.shared.worker import LeaseProgress, WorkerRecord
from tests.support.fast_settings import fast_settings

WINDOW = 20.0
STALLED = LeaseProgress(stalled=True)
REFUSED = LeaseProgress(refused=True)


def row(name: str, **progress: LeaseProgress) -> WorkerRecord:
    return WorkerRecord(name, 1, lease_progress=progress)


def leases(owner: str, hot_owner: str | None = None, finished: bool = False) -> list[Lease]:
    """Lease "hot" (owned by `hot_owner`, else `owner`) and "cold" (owned by `owner`)."""
    hot = Lease("hot", lease_owner=hot_owner or owner)
    return [hot.with_changes(checkpoint=SHARD_END) if finished else hot, Lease("cold", lease_owner=owner)]


def test_the_window_is_two_give_up_spans_of_a_slow_reader() -> None:
    settings = load_settings(**fast_settings(failover_time_millis=3000, heartbeat_interval_millis=1000))
    assert MIN_WORKERS == 2
    assert window_for(settings) == 2 * (3.0 + 3 * 3.0)  # red after 3 heartbeats, then 3 failover times


def test_one_worker_stalling_is_no_verdict_and_a_second_one_within_the_window_is() -> None:
    stalls = ShardStalls(WINDOW)
    assert stalls.judge([row("w1", hot=STALLED), row("w2")], leases("w2", "w1"), 0.0) == frozenset()
    # w1 gave it back (refused: its stall goes on counting), w2 took it and stalls too
    verdict = stalls.judge([row("w1", hot=REFUSED), row("w2", hot=STALLED)], leases("w1", "w2"), 15.0)
    assert verdict == {"hot"} and stalls.workers("hot") == ["w1", "w2"]


def test_evidence_past_the_window_is_forgotten() -> None:
    stalls = ShardStalls(WINDOW)
    stalls.judge([row("w1", hot=STALLED)], leases("w1"), 0.0)
    # w1's row no longer mentions the lease (its refusal ran out, or it restarted): w2 stalls 20.1 s later
    assert stalls.judge([row("w1"), row("w2", hot=STALLED)], leases("w1", "w2"), WINDOW + 0.1) == frozenset()
    assert stalls.workers("hot") == ["w2"]


def test_a_refusal_without_a_stall_behind_it_is_no_evidence() -> None:
    """A lease given back because its processor fails to start (decision 0022) says nothing of its reads."""
    stalls = ShardStalls(WINDOW)
    assert stalls.judge([row("w1", hot=REFUSED), row("w2", hot=STALLED)], leases("w1", "w2"), 0.0) == frozenset()
    assert stalls.workers("hot") == ["w2"]


def test_the_verdict_holds_while_the_owner_keeps_stalling_and_ends_a_window_after_it_reads() -> None:
    stalls = ShardStalls(WINDOW)
    stalls.judge([row("w1", hot=STALLED)], leases("w1"), 0.0)
    stalls.judge([row("w1", hot=REFUSED), row("w2", hot=STALLED)], leases("w1", "w2"), 10.0)
    for now in range(20, 600, 10):  # ten minutes: w1's refusal long gone from its row, w2 still stalls
        assert stalls.judge([row("w1"), row("w2", hot=STALLED)], leases("w1", "w2"), float(now)) == {"hot"}
    # w2 reads again: the verdict lasts while the evidence is within the window, then ends
    assert stalls.judge([row("w1"), row("w2")], leases("w1", "w2"), 600.0) == {"hot"}
    assert stalls.judge([row("w1"), row("w2")], leases("w1", "w2"), 590.0 + WINDOW + 0.1) == frozenset()


def test_a_verdict_that_lapsed_is_not_sticky_and_a_finished_lease_has_none() -> None:
    stalls = ShardStalls(WINDOW)
    stalls.judge([row("w1", hot=STALLED), row("w2", hot=STALLED)], leases("w1"), 0.0)
    assert stalls.verdict == {"hot"}
    assert stalls.judge([row("w1", hot=STALLED), row("w2", hot=STALLED)], leases("w1", finished=True),
                        1.0) == frozenset()
    assert stalls.workers("hot") == []


def test_the_feed_tells_each_owner_its_own_shard_stalled_leases_and_wakes_it_without_a_version() -> None:
    feed = AssignmentFeed()
    view = [Lease("hot", lease_owner="w1"), Lease("cold", lease_owner="w1"), Lease("other", lease_owner="w2")]
    feed.observe(1, view)
    start = {worker: feed.position(worker) for worker in ("w1", "w2")}

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, lambda: threading.Thread(
            target=feed.observe, args=(1, view), kwargs={"shard_stalls": frozenset({"hot"})}).start())
        woken = await asyncio.wait_for(feed.wait("w1", start["w1"].feed, start["w1"].version, 30), 5)
        assert woken.shard_stalls == {"hot"} and woken.version == start["w1"].version
        other = await feed.wait("w2", start["w2"].feed, start["w2"].version, 0.2)  # not w2's lease: no wake
        assert other.shard_stalls == frozenset()

    asyncio.run(scenario())
    feed.stand_down()
    assert feed.shard_stalls == frozenset()
