"""The stalled-lease rule (agent/stall_watch.py) on a manual clock: reported to the leader after 1 heartbeat interval
without progress while its reads fail (2 whatever they do), red after 3, given back at once when the reader is not
running, at red when its reads only failed since its last progress, after 3 failover times more when it is merely
slow (a call in flight), unless a fresh verdict of the leader says most of the fleet stalls with it (then kept,
health green: decision 0039), or that this lease's reads stalled at another worker too (kept the same way: decision
0043; not when they failed on this worker's own credentials)."""

from __future__ import annotations

from shardherd.agent.read_deadline import kinesis_timeouts
from shardherd.agent.stall_watch import FleetVerdict, StallWatch, Verdict, verdict
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import Settings, load_settings
from shardherd.shared.stall_bounds import StallBounds
from tests.support.fast_settings import fast_settings

BOUNDS = StallBounds(red_after=3.0, give_up_after=8.0, report_after=2.0, fail_report_after=1.0)


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
    assert StallBounds.from_settings(settings) == StallBounds(3.0, 12.0, 2.0, 1.0)


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
    assert verdict(3.1, True, BOUNDS, kept=True) is Verdict.HELD
    assert verdict(100.0, True, BOUNDS, kept=True) is Verdict.HELD
    assert verdict(3.1, False, BOUNDS, kept=True) is Verdict.GIVE_UP
    assert verdict(3.0, True, BOUNDS, kept=True) is Verdict.OK
    # no fresh word now, but one 5 s ago or less (the span from red to give-up): kept a little longer, health red
    assert verdict(100.0, True, BOUNDS, since_kept=5.0) is Verdict.STALLED
    assert verdict(100.0, True, BOUNDS, since_kept=5.1) is Verdict.GIVE_UP


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
    assert stalls.problem() is None  # held for the red bound more, counted from the word's last fresh moment
    clock.advance(2.9)
    assert stalls.problem() is None
    clock.advance(0.1)
    assert stalls.problem() is not None  # red once the lease had its red bound since the word
    clock.advance(1.9)  # 5 s since the word was last fresh (the check at its freshness bound saw it)
    stalls.check()
    assert fleet.given == []
    clock.advance(0.1)
    stalls.check()
    assert fleet.given == ["a"] and stalls.given_up == 1


def test_a_lease_kept_through_a_fleet_wide_stall_is_not_red_the_moment_the_verdict_ends() -> None:
    """Session 23's 5-minute Kinesis blackhole: an agent's /healthz flashed red 2 s after the heal. The leader's
    verdict turned once most workers read again, and a lease whose reader had not read yet was red at once, its red
    bound counted from its progress before the outage. Now it has the red bound from the verdict's end to read."""
    clock, fleet = ManualClock(), Fleet("a", "b")
    word = FleetVerdict(clock, fresh_for=BOUNDS.red_after)
    stalls = StallWatch(clock, BOUNDS, lambda: fleet.held, fleet.give_back, fleet_stalls=word)
    stalls.check()
    for _ in range(600):  # 300 s without progress, the leader saying "the fleet stalls" every 0.5 s
        clock.advance(0.5)
        word.heard(True)
        stalls.check()
    stalls.progressed("a")  # the heal: "a" reads again, and the leader's verdict turns
    word.heard(False)
    for _ in range(6):  # "b" reads 3 s (the red bound) after the verdict's last fresh word
        assert stalls.problem() is None and fleet.given == []
        clock.advance(0.5)
        stalls.progressed("a")
        word.heard(False)
        stalls.check()
    assert stalls.problem() is None
    clock.advance(0.1)
    assert stalls.problem() == "lease b made no progress for 303.1 s (bound 3.0 s)"  # none by then: red
    stalls.progressed("b")
    assert stalls.problem() is None and fleet.given == []


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


# ------------------------------------------------------------------ failing reads against slow ones (invariant 3)
def test_a_lease_whose_reads_only_failed_is_given_back_at_the_failing_bound() -> None:
    """An agent's own fault (ExpiredToken, a malformed body, throttling, a hang past the read deadline): given back at
    red, where a slow reader keeps 3 failover times more (session 21: 2 more for failing reads, 9.5 s at the
    matrix's timings; before it both waited 3: 12.5 s)."""
    clock, fleet = ManualClock(), Fleet("failing", "slow")
    stalls = watch(clock, fleet)
    stalls.check()
    clock.advance(1.0)
    stalls.failed("failing", "ClientError: ExpiredTokenException")
    clock.advance(2.0)  # 3.0 s without progress: at the failing bound (red)
    stalls.check()
    assert fleet.given == []
    clock.advance(0.1)
    assert [(state.lease_key, state.failure) for state in stalls.stalled()] == [
        ("failing", "ClientError: ExpiredTokenException"), ("slow", None)]
    stalls.check()
    assert fleet.given == ["failing"] and stalls.given_up == 1
    clock.advance(4.9)  # 8.0 s: the slow reader keeps the generous bound
    stalls.check()
    assert fleet.given == ["failing"]
    clock.advance(0.1)
    stalls.check()
    assert fleet.given == ["failing", "slow"]


def test_progress_after_a_failure_makes_the_reader_slow_again() -> None:
    clock, fleet = ManualClock(), Fleet("a")
    stalls = watch(clock, fleet)
    stalls.check()
    stalls.failed("a", "ReadTimeoutError: read timeout")  # one failed read, then an answer: not failing any more
    clock.advance(0.5)
    stalls.progressed("a")
    clock.advance(5.5)
    stalls.check()
    assert fleet.given == []
    assert verdict(3.1, True, BOUNDS, failing=True) is Verdict.GIVE_UP
    assert verdict(3.1, True, BOUNDS) is Verdict.STALLED
    assert verdict(3.0, True, BOUNDS, failing=True) is Verdict.OK


def test_a_fleet_verdict_keeps_failing_leases_and_after_one_the_generous_span_applies() -> None:
    """A global fault (every agent's credentials rejected, Kinesis hung for all): the sooner bound must not beat the
    leader's verdict, nor give back at once when the word goes quiet for a moment (a leader change)."""
    assert verdict(100.0, True, BOUNDS, kept=True, failing=True) is Verdict.HELD
    assert verdict(100.0, True, BOUNDS, since_kept=5.0, failing=True) is Verdict.STALLED
    assert verdict(100.0, True, BOUNDS, since_kept=5.1, failing=True) is Verdict.GIVE_UP
    clock, fleet = ManualClock(), Fleet("a")
    word = FleetVerdict(clock, fresh_for=BOUNDS.red_after)
    stalls = StallWatch(clock, BOUNDS, lambda: fleet.held, fleet.give_back, fleet_stalls=word)
    stalls.check()
    for _ in range(20):  # 10 s of failed reads, the leader saying "the fleet stalls" from 4 s on
        clock.advance(0.5)
        stalls.failed("a", "ClientError: ExpiredTokenException")
        if clock.monotonic() >= 4.0:
            word.heard(True)
        stalls.check()
    assert fleet.given == [] and stalls.problem() is None


def test_a_failed_read_of_a_lease_given_back_is_forgotten() -> None:
    clock, fleet = ManualClock(), Fleet("a")
    stalls = watch(clock, fleet)
    stalls.check()
    stalls.failed("a", "ClientError: ExpiredTokenException")
    clock.advance(3.1)
    stalls.check()
    assert fleet.given == ["a"]
    fleet.held.add("a")  # the leader hands it back later: a fresh clock, no failure on record
    stalls.check()
    clock.advance(3.1)
    stalls.check()
    assert fleet.given == ["a"] and [state.failure for state in stalls.stalled()] == [None]


def test_a_hung_read_fails_at_its_deadline_before_the_failing_bound() -> None:
    """A Kinesis call that hangs must turn into a failed read (agent/read_deadline.py) before the failing bound at
    the user's defaults, and well before the slow one at the fault matrix's timings (where the deadline's 5 s floor
    comes after red: a hung lease goes at its first failed read); botocore's 30 s read timeout did not."""
    defaults = load_settings()
    bounds = StallBounds.from_settings(defaults)
    assert kinesis_timeouts(defaults) == (2.5, 5.0) and bounds.red_after > 5.0
    short = load_settings(failover_time_millis=3000)
    connect, read = kinesis_timeouts(short)
    assert connect < StallBounds.from_settings(short).red_after < read < failover_plus_five(short)


def failover_plus_five(settings: Settings) -> float:
    """The issue's target for a worker taken out: its shards read elsewhere within the failover time + 5 s."""
    return settings.failover_time_millis / 1000 + 5.0


# ------------------------------------------------------------------ a lease stalled at every owner (decision 0043)
def shard_watch(clock: ManualClock, fleet: Fleet, word: FleetVerdict) -> StallWatch:
    return StallWatch(clock, BOUNDS, lambda: fleet.held, fleet.give_back, lambda key: key not in fleet.dead,
                      fleet_stalls=word, shard_stalls=word.shard_stalls)


def test_a_fresh_shard_verdict_keeps_only_that_failing_lease_past_its_bound_with_health_green() -> None:
    """The leader says lease "hot" stalled at another worker too: kept while its reader retries; "local", failing as
    long with no such word, is this worker's fault and goes at the failing bound."""
    clock, fleet = ManualClock(), Fleet("hot", "local", "fine")
    word = FleetVerdict(clock, fresh_for=BOUNDS.red_after)
    stalls = shard_watch(clock, fleet, word)
    stalls.check()
    for _ in range(60):  # 30 s of failed reads on two leases, the leader naming "hot" every 0.5 s from 2 s on
        clock.advance(0.5)
        stalls.progressed("fine")
        for key in ("hot", "local"):
            stalls.failed(key, "ReadTimeoutError: read timeout")
        word.heard(False, {"hot"} if clock.monotonic() >= 2.0 else ())
        stalls.check()
    assert fleet.given == ["local"] and stalls.given_up == 1
    assert [(state.lease_key, state.verdict, state.shard_stalled) for state in stalls.stalled()] == [
        ("hot", Verdict.HELD, True)]
    assert stalls.problem() is None  # a restart cannot fix the shard: health green
    assert stalls.stalled_keys() == {"hot"}  # still reported in the worker row: the leader's evidence goes on
    assert not word()  # no fleet-wide stall was said


def test_a_not_running_reader_of_a_shard_stalled_lease_is_given_back_at_once() -> None:
    clock, fleet = ManualClock(), Fleet("hot")
    word = FleetVerdict(clock, fresh_for=BOUNDS.red_after)
    stalls = shard_watch(clock, fleet, word)
    stalls.check()
    clock.advance(BOUNDS.red_after + 0.1)
    word.heard(False, {"hot"})
    stalls.check()
    assert fleet.given == []
    fleet.dead.add("hot")
    stalls.check()
    assert fleet.given == ["hot"]


def test_a_stale_shard_verdict_gives_back_a_give_up_span_after_its_last_fresh_word() -> None:
    """The word goes quiet (coordinator gone) or stops naming the lease (it read at its owner, or the verdict ended):
    the lease is kept for the span from red to give-up (5 s here) after the word last named it while fresh (a quiet
    word stays fresh for the red bound), then given back."""
    for quiet in (True, False):
        clock, fleet = ManualClock(), Fleet("hot")
        word = FleetVerdict(clock, fresh_for=BOUNDS.red_after)
        stalls = shard_watch(clock, fleet, word)
        stalls.check()
        for _ in range(40):  # 20 s kept, far past the failing bound
            clock.advance(0.5)
            stalls.failed("hot", "ReadTimeoutError: read timeout")
            word.heard(False, {"hot"})
            stalls.check()
        assert fleet.given == []
        last = clock.monotonic() + (BOUNDS.red_after if quiet else 0.0)
        while clock.monotonic() - last < 5.0 - 1e-9:
            clock.advance(0.5)
            if not quiet:
                word.heard(False, ())  # answers go on, without the lease
            stalls.check()
        assert fleet.given == [] and stalls.problem() is not None  # red again once the word is stale
        clock.advance(0.5)
        stalls.check()
        assert fleet.given == ["hot"] and stalls.given_up == 1


# ------------------------------------------------------------------ reports before red; credentials (session 23)
def test_a_lease_is_reported_after_one_interval_while_failing_two_otherwise_and_the_row_is_asked_for_once() -> None:
    """The leader's verdicts count these reports: they come before red, so a verdict can reach the agent before a
    failing lease's give-back at red (invariant 5)."""
    clock, fleet = ManualClock(), Fleet("failing", "slow", "fine")
    start = clock.monotonic()
    asked: list[float] = []
    stalls = StallWatch(clock, BOUNDS, lambda: fleet.held, fleet.give_back,
                        on_report=lambda: asked.append(clock.monotonic() - start))
    stalls.check()
    stalls.failed("failing", "ClientError: ProvisionedThroughputExceededException")
    for step in range(1, 6):  # 2.5 s: "fine" progresses; "failing" only fails; "slow" has a call in flight
        clock.advance(0.5)
        stalls.progressed("fine")
        stalls.check()
        if step == 2:
            assert stalls.stalled_keys() == frozenset()  # 1.0 s, at the bound: not yet
        if step == 3:
            assert stalls.stalled_keys() == {"failing"}
    assert stalls.stalled_keys() == {"failing", "slow"} and asked == [1.5, 2.5]
    assert stalls.problem() is None and fleet.given == []  # reported, not yet red
    stalls.check()
    assert asked == [1.5, 2.5]  # nothing added: no row asked for
    stalls.progressed("slow")
    stalls.check()
    assert stalls.stalled_keys() == {"failing"}


def test_a_shard_verdict_does_not_keep_a_lease_whose_reads_failed_on_this_workers_credentials() -> None:
    """ExpiredToken on this worker: its own fault, whoever else stalled on the lease; a fleet-wide verdict (every
    worker's credentials rejected at once) still keeps it, as handing it round helps nobody."""
    for fleet_wide in (False, True):
        clock, fleet = ManualClock(), Fleet("hot")
        word = FleetVerdict(clock, fresh_for=BOUNDS.red_after)
        stalls = shard_watch(clock, fleet, word)
        stalls.check()
        for _ in range(20):  # 10 s
            clock.advance(0.5)
            stalls.failed("hot", "ClientError: ExpiredTokenException", own=True)
            stalls.failed("hot", "ShardReadError: GetRecords failed")  # the reopen's line: still its own fault
            word.heard(fleet_wide, {"hot"})
            stalls.check()
        assert fleet.given == ([] if fleet_wide else ["hot"]), fleet_wide
