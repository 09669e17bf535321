"""The stalled-lease rule (agent/stall_watch.py) on a manual clock: red after 3 heartbeat intervals without progress,
given back at once when the reader is not running, after 3 failover times more when it still runs (a hang)."""

from __future__ import annotations

from shardherd.agent.stall_watch import StallBounds, StallWatch, Verdict, verdict
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from tests.support.fast_settings import fast_settings

BOUNDS = StallBounds(red_after=3.0, give_up_after=8.0)


class Fleet:
    """The held leases, which readers run, and what was given back."""

    def __init__(self, *held: str) -> None:
        self.held = set(held)
        self.dead: set[str] = set()
        self.given: list[str] = []

    def give_back(self, key: str, why: str) -> None:
        self.given.append(key)
        self.held.discard(key)


def watch(clock: ManualClock, fleet: Fleet) -> StallWatch:
    return StallWatch(clock, BOUNDS, lambda: fleet.held, fleet.give_back, lambda key: key not in fleet.dead)


def test_the_bounds_come_from_the_heartbeat_interval_and_the_failover_time() -> None:
    settings = load_settings(**fast_settings(failover_time_millis=3000, heartbeat_interval_millis=1000))
    assert StallBounds.from_settings(settings) == StallBounds(3.0, 12.0)


def test_verdicts_at_the_edges() -> None:
    assert verdict(3.0, True, BOUNDS) is Verdict.OK
    assert verdict(3.1, True, BOUNDS) is Verdict.STALLED
    assert verdict(3.1, False, BOUNDS) is Verdict.GIVE_UP
    assert verdict(8.1, True, BOUNDS) is Verdict.GIVE_UP


def test_a_reader_that_progresses_keeps_its_lease_and_health_green() -> None:
    clock, fleet = ManualClock(), Fleet("a")
    stalls = watch(clock, fleet)
    for _ in range(20):
        stalls.progressed("a")
        clock.advance(1.0)
        stalls.check()
    assert stalls.problem() is None and fleet.given == [] and stalls.given_up == 0


def test_a_dead_reader_turns_health_red_and_its_lease_is_given_back_at_the_red_bound() -> None:
    clock, fleet = ManualClock(), Fleet("a", "b")
    stalls = watch(clock, fleet)
    stalls.check()  # first seen: both clocks start
    fleet.dead.add("a")
    clock.advance(2.9)
    stalls.progressed("b")
    stalls.check()
    assert stalls.problem() is None and fleet.given == []
    clock.advance(0.2)
    assert stalls.problem() is not None and "lease a made no progress for 3.1 s" in (stalls.problem() or "")
    stalls.check()
    assert fleet.given == ["a"] and stalls.given_up == 1
    assert stalls.problem() is None  # b progressed 0.2 s ago; a is no longer held


def test_a_hung_reader_is_red_first_and_given_back_after_the_failover_time_more() -> None:
    clock, fleet = ManualClock(), Fleet("a")
    stalls = watch(clock, fleet)
    stalls.check()
    clock.advance(4.0)
    stalls.check()
    assert fleet.given == [] and [s.lease_key for s in stalls.stalled()] == ["a"]
    clock.advance(4.5)
    stalls.check()
    assert fleet.given == ["a"]


def test_a_lease_taken_again_starts_a_fresh_clock() -> None:
    clock, fleet = ManualClock(), Fleet("a")
    stalls = watch(clock, fleet)
    stalls.check()
    fleet.held.clear()
    stalls.check()
    clock.advance(100.0)
    fleet.held.add("a")
    assert stalls.stalled() == []
