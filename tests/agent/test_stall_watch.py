"""The stalled-lease rule (agent/stall_watch.py) on a manual clock: red after 3 heartbeat intervals without progress,
given back at once when the reader is not running, after 3 failover times more when it still runs (a hang), unless a
fresh verdict of the leader says most of the fleet stalls with it (then kept, health green: decision 0039)."""

from __future__ import annotations

from shardherd.agent.stall_watch import FleetVerdict, StallBounds, StallWatch, Verdict, verdict
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


# ------------------------------------------------------------------ a fleet-wide stall (decision 0039)
def test_with_the_fleet_stalling_a_running_reader_is_held_and_a_dead_one_still_given_back() -> None:
    assert verdict(3.1, True, BOUNDS, fleet_stalls=True) is Verdict.HELD
    assert verdict(100.0, True, BOUNDS, fleet_stalls=True) is Verdict.HELD
    assert verdict(3.1, False, BOUNDS, fleet_stalls=True) is Verdict.GIVE_UP
    assert verdict(3.0, True, BOUNDS, fleet_stalls=True) is Verdict.OK
    # no fresh word now, but one 5 s ago or less (the span from red to give-up): kept a little longer, health red
    assert verdict(100.0, True, BOUNDS, since_fleet_stall=5.0) is Verdict.STALLED
    assert verdict(100.0, True, BOUNDS, since_fleet_stall=5.1) is Verdict.GIVE_UP


def test_a_fresh_fleet_verdict_keeps_stalled_leases_past_the_give_up_bound_with_health_green() -> None:
    clock, fleet = ManualClock(), Fleet("a", "b")
    word = FleetVerdict(clock, fresh_for=BOUNDS.red_after)
    stalls = StallWatch(clock, BOUNDS, lambda: fleet.held, fleet.give_back, lambda key: key not in fleet.dead,
                        fleet_stalls=word)
    stalls.check()
    for _ in range(40):  # 20 s without progress, the leader saying "the fleet stalls" every 0.5 s
        clock.advance(0.5)
        word.heard(True)
        stalls.check()
    assert fleet.given == [] and stalls.given_up == 0
    assert stalls.problem() is None  # a shared outage: no pod restart
    assert stalls.stalled_keys() == {"a", "b"}  # still reported in the worker row
    assert [state.verdict for state in stalls.stalled()] == [Verdict.HELD, Verdict.HELD]
    fleet.dead.add("a")  # a reader that is not running is a local fault: given back at once
    stalls.check()
    assert fleet.given == ["a"] and stalls.stalled_keys() == {"b"}
    stalls.progressed("b")  # reads come back: the clock resets, nothing else to do
    stalls.check()
    assert stalls.stalled_keys() == frozenset() and stalls.problem() is None


def test_a_stale_or_missing_fleet_verdict_falls_back_to_giving_back_a_give_up_span_after_the_last_word() -> None:
    """No fresh word (coordinator down, a leader change) is today's rule, with the span from red to give-up (5 s
    here; 3 failover times) counted from the last moment a word that the fleet stalls was fresh too: a leader change
    of a few seconds gives nothing back, a coordinator gone for longer does."""
    clock, fleet = ManualClock(), Fleet("a")
    word = FleetVerdict(clock, fresh_for=BOUNDS.red_after)
    stalls = StallWatch(clock, BOUNDS, lambda: fleet.held, fleet.give_back, fleet_stalls=word)
    stalls.check()
    assert not word()  # nothing heard yet
    clock.advance(20.0)
    word.heard(True)  # the last word before the channel went quiet
    stalls.check()
    assert word() and stalls.problem() is None and fleet.given == []
    clock.advance(BOUNDS.red_after)  # exactly the freshness bound: still fresh
    stalls.check()
    assert word() and fleet.given == []
    clock.advance(0.1)
    assert not word()
    assert stalls.problem() is not None  # red again at once
    clock.advance(4.9)  # 5 s since the word was last fresh (the check at its freshness bound saw it)
    stalls.check()
    assert fleet.given == []
    clock.advance(0.1)
    stalls.check()
    assert fleet.given == ["a"] and stalls.given_up == 1


def test_without_any_word_of_the_leader_the_rule_is_todays() -> None:
    clock, fleet = ManualClock(), Fleet("a")
    stalls = StallWatch(clock, BOUNDS, lambda: fleet.held, fleet.give_back,
                        fleet_stalls=FleetVerdict(clock, fresh_for=BOUNDS.red_after))
    stalls.check()
    clock.advance(8.0)
    stalls.check()
    assert fleet.given == []
    clock.advance(0.1)
    stalls.check()
    assert fleet.given == ["a"]


def test_a_verdict_that_the_fleet_does_not_stall_gives_back_as_today() -> None:
    clock, fleet = ManualClock(), Fleet("a")
    word = FleetVerdict(clock, fresh_for=BOUNDS.red_after)
    stalls = StallWatch(clock, BOUNDS, lambda: fleet.held, fleet.give_back, fleet_stalls=word)
    stalls.check()
    for _ in range(16):
        clock.advance(0.5)
        word.heard(False)
        stalls.check()
    assert fleet.given == []  # 8.0 s: at the bound
    clock.advance(0.5)
    word.heard(False)
    stalls.check()
    assert fleet.given == ["a"]
