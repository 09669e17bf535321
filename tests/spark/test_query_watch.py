"""The Spark query's progress rule (agent/spark/query_watch.py) on a manual clock: completed triggers, commits and
Spark's jobs moving on are progress; a running trigger that changes none of them is stuck; the first trigger is
start-up for the leases but not for the exit; a verdict of the leader that keeps the driver's leases holds the exit."""

from __future__ import annotations

from shardherd.agent.spark.query_watch import QueryWatch
from shardherd.agent.stall_watch import FleetVerdict, StallWatch
from shardherd.shared.clock import ManualClock
from shardherd.shared.stall_bounds import StallBounds


def test_a_long_batch_whose_jobs_move_on_is_not_stuck_one_that_changes_nothing_is() -> None:
    clock = ManualClock()
    watch = QueryWatch(clock, exit_after=30.0)
    watch.observe(True, (1, ()))
    watch.observe(False, None)  # the first trigger ended
    for job in range(2, 40):  # a 38 s batch: a job every second
        clock.advance(1.0)
        watch.observe(True, (job, ()))
    assert watch.stuck_for() == 0.0 and not watch.hung() and watch.last_progress == clock.monotonic()
    stuck_at = clock.monotonic()
    for _ in range(31):  # the same batch, nothing moves
        clock.advance(1.0)
        watch.observe(True, (39, ()))
    assert watch.last_progress == stuck_at and watch.stuck_for() == 31.0 and watch.hung()
    watch.committed()
    assert not watch.hung()


def test_the_first_trigger_is_start_up_for_the_leases_but_bounded_by_the_exit() -> None:
    clock = ManualClock()
    watch = QueryWatch(clock, exit_after=30.0)
    watch.observe(False, None)  # initializing sources: no trigger yet
    watch.observe(True, None)
    clock.advance(20.0)
    watch.observe(True, None)  # the first trigger spawns the source runner: no job
    assert not watch.started and watch.last_progress == clock.monotonic() and watch.stuck_for() == 20.0
    clock.advance(11.0)
    watch.observe(True, None)
    assert watch.hung()  # a first trigger that never ends still ends the driver
    watch.observe(False, None)
    assert watch.started and watch.stuck_for() == 0.0


def test_a_query_stuck_while_a_verdict_keeps_its_leases_waits_and_counts_its_bound_from_the_last_word() -> None:
    """A fleet-wide Kinesis stall holds every batch: the driver waits as a plain agent's readers do (decision 0039),
    and once the word goes stale (and the stall watch's grace after it) the exit's bound runs again, from then."""
    clock = ManualClock()
    bounds = StallBounds(red_after=3.0, give_up_after=8.0, report_after=2.0, fail_report_after=1.0)
    word = FleetVerdict(clock, fresh_for=bounds.red_after)
    given: list[str] = []
    stalls = StallWatch(clock, bounds, lambda: {"a", "b"}, lambda key, why: given.append(key), fleet_stalls=word)
    watch = QueryWatch(clock, exit_after=10.0)
    watch.observe(True, (1, ()))
    watch.observe(False, None)  # the first trigger ended
    watch.observe(True, (2, ()))  # a batch starts and its reads get no answer
    stalled_at = clock.monotonic()
    for _ in range(120):  # 60 s, the leader saying "the fleet stalls" every 0.5 s
        clock.advance(0.5)
        word.heard(True)
        watch.observe(True, (2, ()), excused=bool(stalls.held()))
    assert given == [] and not watch.hung() and watch.last_progress == stalled_at  # an excuse is not progress
    last_excuse = clock.monotonic()
    while not watch.hung():  # the word stops: the stall watch keeps the leases a while, then the bound runs
        clock.advance(0.5)
        watch.observe(True, (2, ()), excused=bool(stalls.held()))
    held_until = last_excuse + 2 * bounds.red_after  # the word is fresh for red_after, then held for red_after more
    assert held_until + watch.exit_after <= clock.monotonic() <= held_until + watch.exit_after + 1.0


def test_without_a_verdict_a_stuck_query_is_hung_at_its_bound() -> None:
    clock = ManualClock()
    bounds = StallBounds(red_after=3.0, give_up_after=8.0, report_after=2.0, fail_report_after=1.0)
    stalls = StallWatch(clock, bounds, lambda: {"a"}, lambda key, why: None, fleet_stalls=FleetVerdict(clock, 3.0))
    watch = QueryWatch(clock, exit_after=10.0)
    watch.observe(False, None)
    watch.observe(True, (2, ()))
    for _ in range(21):
        clock.advance(0.5)
        watch.observe(True, (2, ()), excused=bool(stalls.held()))
    assert watch.hung() and watch.stuck_for() == 10.5
