"""The probe rounds' schedule: a round ends just before each trigger (one per trigger), never more often than the
probe period."""

from __future__ import annotations

import itertools
import math

import pytest

from shardherd.agent.spark.probe_schedule import ProbeSchedule


def _rounds(schedule: ProbeSchedule, duration: float, start: float, until: float) -> list[tuple[float, float]]:
    """(start, end) of each round the driver's loop would run, rounds taking `duration` seconds."""
    rounds, now = [], start
    while now < until:
        began = now + schedule.delay(now)
        now = began + duration
        schedule.round_took(duration)
        rounds.append((began, now))
    return rounds


def _shortest_gap(rounds: list[tuple[float, float]]) -> float:
    """The shortest time between two rounds' starts."""
    return min(b - a for (a, _), (b, _) in itertools.pairwise(rounds))


def test_without_a_trigger_rounds_follow_the_period() -> None:
    schedule = ProbeSchedule(0.5)
    assert [schedule.delay(now) for now in (0.0, 10.123, 99.999)] == [0.5, 0.5, 0.5]


@pytest.mark.parametrize("trigger", [1.0, 2.0, 5.0, 1.2])
def test_each_trigger_is_preceded_by_a_round_that_ended_just_before_it(trigger: float) -> None:
    schedule = ProbeSchedule(0.5)
    schedule.trigger = trigger
    rounds = _rounds(schedule, 0.04, 1_000.37, 1_030.0)  # the lead settles within the first 15 s
    triggers = [k * trigger for k in range(math.ceil(1_016.0 / trigger), math.floor(1_029.0 / trigger) + 1)]
    for boundary in triggers:
        before = [end for _, end in rounds if end <= boundary]
        assert boundary - max(before) <= schedule.lead, (boundary, before[-3:])
    settled = _rounds(schedule, 0.04, 1_030.0, 1_030.0 + 6 * trigger)
    assert _shortest_gap(settled) >= trigger - 1e-3  # one round per trigger (once the lead settled)


@pytest.mark.parametrize(("trigger", "step"), [(1.0, 1.0), (0.7, 0.7), (1.2, 1.2), (0.3, 0.6), (0.1, 0.5)])
def test_the_rounds_never_come_more_often_than_the_period(trigger: float, step: float) -> None:
    schedule = ProbeSchedule(0.5)
    schedule.trigger = trigger
    assert schedule.aligned_period() == pytest.approx(step)
    rounds = _rounds(schedule, 0.02, 50.01, 110.0)[30:]  # once the lead settled on the rounds' duration
    assert _shortest_gap(rounds) >= step - 1e-3
    targets = [began + schedule.lead for began, _ in rounds]
    assert all(abs(value / step - round(value / step)) < 1e-3 for value in targets), targets[:5]


def test_slow_rounds_start_earlier_up_to_half_a_period() -> None:
    schedule = ProbeSchedule(0.5)
    quick = schedule.lead
    for _ in range(30):
        schedule.round_took(0.12)
    assert quick < schedule.lead == pytest.approx(1.5 * 0.12 + 0.03, abs=0.005)
    for _ in range(30):
        schedule.round_took(2.0)
    assert schedule.lead == 0.25


def test_the_next_round_serves_the_next_grid_point_at_least_half_a_step_away() -> None:
    schedule = ProbeSchedule(0.5)
    schedule.trigger = 1.0
    lead = schedule.lead
    assert schedule.delay(19.4) == pytest.approx(0.6 - lead)  # the trigger at 20 s: a grid point 0.6 s away
    assert schedule.delay(19.6) == pytest.approx(1.4 - lead)  # too close (the round before served it): 21 s
    assert schedule.delay(20.2) == pytest.approx(0.8 - lead)  # a round that overran 20 s still serves 21 s
