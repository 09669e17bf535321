"""The Spark query's progress rule (agent/spark/query_watch.py) on a manual clock: completed triggers, commits and
Spark's jobs moving on are progress; a running trigger that changes none of them is stuck; the first trigger is
start-up for the leases but not for the exit."""

from __future__ import annotations

from shardherd.agent.spark.query_watch import QueryWatch
from shardherd.shared.clock import ManualClock


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
