"""The desired-worker count (coordinator/scale_model.py): capacity from each worker's reports, bounds, monotone in
load, hysteresis (at most one change per direction per window), a growing lag asking for more, the removal candidate.
Random fleets (hypothesis, seeded by its database-free default profile) and worked examples; time is the run's
monotonic seconds, never a sleep.
"""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from shardherd.coordinator.load_model import Line
from shardherd.coordinator.scale_model import (
    LAG_FLOOR_MILLIS,
    ScaleFigure,
    ScaleSettings,
    ScaleState,
    inherited,
    need,
    removal_candidate,
    scale_in_to,
    step,
    worker_capacity,
)
from shardherd.coordinator.snapshot import LeaseView, Snapshot, WorkerView
from shardherd.shared.config import load_settings

CFG = ScaleSettings(target_percentage=70, min_workers=1, max_workers=50, out_after=60.0, in_after=300.0)
RUN = 2.0  # seconds between full runs in these examples


@st.composite
def fleets(draw: st.DrawFn) -> Snapshot:
    """A random fleet: CPU workers (any value, some failing or invalid), default-metric ones, unowned leases."""
    wids = [f"w{i}" for i in range(draw(st.integers(0, 8)))]
    leases = []
    for i in range(draw(st.integers(0, 25))):
        kbps = draw(st.one_of(st.none(), st.floats(0, 5000), st.just(0.0)))
        leases.append(LeaseView(f"l{i:02d}", draw(st.sampled_from([*wids, None])), throughput_kbps=kbps,
                                finished=draw(st.integers(0, 9)) == 0, expired=draw(st.integers(0, 9)) == 0))
    workers = []
    for wid in wids:
        kind = draw(st.sampled_from(["cpu", "cpu", "default", "failing"]))
        draining, stale = draw(st.integers(0, 5)) == 0, draw(st.integers(0, 5)) == 0
        history = tuple(draw(st.lists(st.floats(0, 100), min_size=1, max_size=4)))
        if kind == "default":
            workers.append(WorkerView(wid, draining=draining, stale=stale))
        else:
            history = (*history, -1.0) if kind == "failing" else history
            workers.append(WorkerView(wid, {"C": history}, {"C": (draw(st.sampled_from([50.0, 100.0])),)},
                                      draining=draining, throughput_history=tuple(draw(st.lists(st.floats(0, 5000),
                                                                                                max_size=3))),
                                      stale=stale))
    base = draw(st.one_of(st.none(), st.floats(0, 30)))
    return Snapshot.of(leases, workers, {} if base is None else {"C": Line(base, 0.01)})


CONFIGS = st.builds(ScaleSettings, target_percentage=st.sampled_from([10.0, 70.0, 100.0]),
                    min_workers=st.integers(1, 4), max_workers=st.integers(4, 30),
                    out_after=st.sampled_from([0.0, 10.0]), in_after=st.sampled_from([0.0, 30.0]),
                    max_leases_for_worker=st.sampled_from([3, 2**31 - 1]),
                    max_throughput_per_host_kbps=st.sampled_from([math.inf, 800.0]))


@settings(max_examples=150, deadline=None)
@given(fleets(), CONFIGS, st.lists(st.one_of(st.none(), st.integers(0, 10**7)), min_size=1, max_size=6))
def test_random_fleets_never_raise_and_stay_within_the_bounds(snapshot: Snapshot, cfg: ScaleSettings,
                                                             lags: list[int | None]) -> None:
    state = ScaleState()
    for run, lag in enumerate(lags):
        state, maybe = step(state, snapshot, lag, run * 20.0, cfg)
        members = {w.worker_id for w in snapshot.workers if not w.draining}
        if maybe is None:  # a term's count waits for a worker, at most a scale-out window
            assert not members and run * 20.0 < cfg.out_after
            continue
        figure = maybe
        assert isinstance(figure.desired, int)
        assert max(1, cfg.min_workers) <= figure.desired <= cfg.max_workers
        assert figure.current == len(members)
        assert figure.remove_first is None or figure.remove_first in members
        assert figure.capacity_kbps is None or figure.capacity_kbps > 0


def _step(state: ScaleState, snapshot: Snapshot, lag: int | None, now: float,
          cfg: ScaleSettings) -> tuple[ScaleState, ScaleFigure]:
    """`step` on a fleet with workers, which always has a figure."""
    state, figure = step(state, snapshot, lag, now, cfg)
    assert figure is not None
    return state, figure


def test_a_term_has_no_figure_until_it_sees_a_worker_or_a_scale_out_window_passed() -> None:
    empty = Snapshot.of([LeaseView("l0", None, throughput_kbps=10.0)], [])
    state, figure = step(ScaleState(), empty, None, 100.0, CFG)
    assert figure is None
    state, figure = step(state, empty, None, 100.0 + CFG.out_after, CFG)
    assert figure is not None and figure.desired == 1 and figure.current == 0
    state, figure = step(ScaleState(began=100.0), _fleet({"a": 50}, {"a": [100.0]}), None, 102.0, CFG)
    assert figure is not None and figure.desired == 1


def _fleet(cpu: dict[str, float], owned: dict[str, list[float]], unowned: list[float] = (),  # type: ignore[assignment]
           base: float = 10.0, lag: tuple[str, ...] = ()) -> Snapshot:
    """Workers reporting steady CPU, owning leases of the given KiB/s; plus unowned leases; the fleet's base line."""
    leases = [LeaseView(f"{wid}-{i}", wid, throughput_kbps=kbps) for wid, figures in owned.items()
              for i, kbps in enumerate(figures)]
    leases += [LeaseView(f"free-{i}", None, throughput_kbps=kbps) for i, kbps in enumerate(unowned)]
    workers = [WorkerView(wid, {"C": (value, value)}, {"C": (100.0,)},
                          throughput_history=(sum(owned.get(wid, [])),) * 2) for wid, value in cpu.items()]
    return Snapshot.of(leases, workers, {"C": Line(base, 0.1)})


def test_capacity_is_the_throughput_per_point_above_the_base_up_to_the_target() -> None:
    # 400 KiB/s at 50 % CPU over a base of 10: 10 KiB/s per point; the target of 70 % leaves 60 points: 600 KiB/s.
    worker = WorkerView("a", {"C": (50.0, 50.0)}, {"C": (100.0,)}, throughput_history=(400.0, 400.0))
    assert worker_capacity(worker, 400.0, {"C": Line(10.0, 0.1)}, CFG) == 600.0
    bounded = ScaleSettings(max_throughput_per_host_kbps=500.0)
    assert worker_capacity(worker, 400.0, {"C": Line(10.0, 0.1)}, bounded) == 350.0  # the host limit at 70 %
    idle = WorkerView("b", {"C": (11.0, 11.0)}, {"C": (100.0,)}, throughput_history=(5.0,))
    assert worker_capacity(idle, 5.0, {"C": Line(10.0, 0.1)}, CFG) is None  # 1 point above the base: no slope
    assert worker_capacity(idle, 5.0, {"C": Line(10.0, 0.1)}, bounded) == 350.0  # but the host limit holds
    assert worker_capacity(WorkerView("c"), 0.0, {}, CFG) is None  # default metric without a host limit
    assert worker_capacity(WorkerView("c"), 0.0, {}, bounded) == 350.0


def test_need_is_the_load_over_the_capacity_and_at_least_the_lease_bound() -> None:
    # Three workers at 50 % carrying 400 KiB/s each: 600 per worker at 70 %; 1200 + 1500 unowned = 2700 -> 5.
    snapshot = _fleet({"a": 50, "b": 50, "c": 50}, {"a": [400], "b": [200, 200], "c": [400]}, [1500])
    asked, load, capacity = need(snapshot, CFG, lagging=False)
    assert (load, capacity, asked.out) == (2700.0, 600.0, 5)
    assert asked.fewer == 5  # 2700 / (600 x 0.9) = 5.0
    by_leases = ScaleSettings(max_leases_for_worker=1)
    assert need(snapshot, by_leases, lagging=False)[0].out >= 5  # five open leases, one each
    assert need(snapshot, CFG, lagging=True)[0].out == 5  # already more than current + 1 = 4


@settings(max_examples=100, deadline=None)
@given(fleets(), st.lists(st.floats(0, 3000), max_size=6), st.lists(st.floats(0, 3000), max_size=6))
def test_the_need_is_monotone_in_load(snapshot: Snapshot, extra: list[float], more: list[float]) -> None:
    """Leases needing an owner add load without changing any worker's reports: the ask never falls."""
    def with_unowned(figures: list[float]) -> Snapshot:
        added = [LeaseView(f"new-{i}", None, throughput_kbps=kbps) for i, kbps in enumerate(figures)]
        return Snapshot.of((*snapshot.leases, *added), snapshot.workers, snapshot.lines)

    less, _, _ = need(with_unowned(extra), CFG, lagging=False)
    most, _, _ = need(with_unowned([*extra, *more]), CFG, lagging=False)
    assert most.out >= less.out and most.fewer >= less.fewer


def _run(loads: list[float], cfg: ScaleSettings = CFG) -> list[int]:
    """The published count at each run while the unowned load follows `loads` (two workers carry 800 KiB/s)."""
    state, counts = ScaleState(), []
    for run, unowned in enumerate(loads):
        snapshot = _fleet({"a": 50, "b": 50}, {"a": [400], "b": [400]}, [unowned])
        state, figure = _step(state, snapshot, None, run * RUN, cfg)
        counts.append(figure.desired)
    return counts


def _changes(counts: list[int]) -> list[tuple[int, int]]:
    """(run, +1/-1) at each change of the count."""
    return [(i, 1 if b > a else -1) for i, (a, b) in enumerate(itertools.pairwise(counts), 1) if a != b]


def test_a_load_step_raises_the_count_after_the_out_window_and_lowers_it_after_the_in_window() -> None:
    # 800 carried + 1600 unowned = 2400 KiB/s at 600 per worker -> 4; then back to 800 + 0 -> 2 (1.48 at 0.9).
    counts = _run([0.0] * 5 + [1600.0] * 60 + [0.0] * 200)
    assert counts[0] == 2  # a term starts at the workers there are
    changes = _changes(counts)
    assert [d for _, d in changes] == [1, -1], changes
    out_run, in_run = changes[0][0], changes[1][0]
    assert counts[out_run] == 4 and (out_run - 5) * RUN == CFG.out_after
    assert counts[in_run] == 2 and (in_run - 65) * RUN == CFG.in_after


def test_a_load_ramping_in_through_the_throughput_average_rises_once_to_the_load_it_reached() -> None:
    # The live shape (bench.desired_workers): the extra load reaches the asks over about 30 s (the throughput
    # window), 800 carried + 0 -> 4000 unowned KiB/s; asks 2 -> 8 over 15 runs. Before: the count rose to the
    # window's smallest ask (2, the ramp's first) and to 8 a window later.
    ramp = [4000.0 * run / 15 for run in range(1, 16)]
    counts = _run([0.0] * 5 + ramp + [4000.0] * 80)
    changes = _changes(counts)
    assert [d for _, d in changes] == [1], changes
    out_run = changes[0][0]
    assert counts[out_run] == 8 and counts[-1] == 8
    first_ask = next(run for run, load in enumerate([0.0] * 5 + ramp) if 800 + load > 2 * 600)
    assert (out_run - first_ask) * RUN == CFG.out_after  # one window after the first run asking for more


def test_a_spike_in_the_window_s_second_half_sets_the_count_only_as_far_as_it_held_half_a_window() -> None:
    # Asks of 3 for the first half of the window, then 6 for its last 20 s: the count goes to 3, not 6.
    half = int(CFG.out_after / 2 / RUN)
    counts = _run([0.0] * 5 + [1000.0] * (half + 5) + [3000.0] * (half - 5) + [1000.0] * 20)
    assert max(counts) == 3, _changes(counts)


def test_a_load_that_drains_over_minutes_falls_once_to_what_it_drained_to() -> None:
    # 800 carried + 4000 unowned -> 8 workers; the extra load then decays over 3 minutes (a throughput average
    # draining) to nothing. Every run asks for fewer than 8 from the start of the decay; the largest ask of the first
    # scale-in window is 7, the last minute's 2: the count waits for the asks to settle and falls once, to 2.
    decay = [4000.0 * (1 - run / 90) for run in range(90)]
    counts = _run([4000.0] * 40 + decay + [0.0] * 400)
    changes = _changes(counts)
    assert [d for _, d in changes] == [1, -1], changes
    in_run = changes[1][0]
    assert counts[in_run] == 2 and counts[-1] == 2
    assert CFG.in_after <= (in_run - 40) * RUN <= CFG.in_after + 90 * RUN + CFG.out_after  # waited for the decay


def test_a_load_still_falling_after_two_windows_falls_anyway() -> None:
    # One ask fewer every minute, from 9 down: the last minute never asks for the window's largest.
    asks = [(run * RUN, 9 - int(run * RUN // 60)) for run in range(int(2 * CFG.in_after / RUN) + 1)]
    waiting = [scale_in_to([a for a in asks[: i + 1] if at - a[0] <= CFG.in_after], 0.0, at, CFG)
               for i, (at, _) in enumerate(asks)]  # the last window's asks, as a pending scale-in keeps them
    assert waiting[:-1] == [None] * (len(asks) - 1)  # one window passed long ago, the asks kept falling
    assert waiting[-1] == max(a for at, a in asks if asks[-1][0] - at <= CFG.in_after)  # two windows: it falls


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20), st.integers(0, 3), st.integers(0, 10_000))
def test_a_load_alternating_around_a_threshold_changes_the_count_at_most_once_per_direction_per_window(
        period: int, offset: int, seed: int) -> None:
    """Load flips between just under and just over the 3-worker line (1800 KiB/s) every `period` runs."""
    low, high = 900.0, 1100.0 + 10 * offset  # 800 carried + unowned: 1700 -> 3 workers, 1900+ -> 4
    loads = [high if (run // period + seed) % 2 else low for run in range(300)]
    counts = _run(loads)
    changes = _changes(counts)
    for direction, window in ((1, CFG.out_after), (-1, CFG.in_after)):
        runs = [run for run, d in changes if d == direction]
        assert all((b - a) * RUN >= window for a, b in itertools.pairwise(runs)), changes
    if period * RUN < CFG.out_after:  # flipping faster than either window: the count never moves off its start
        assert set(counts) <= {counts[0]} | ({3} if counts[0] != 3 else set()), changes
        assert len(changes) <= 1


def test_an_idle_stream_asks_for_the_minimum_and_never_zero() -> None:
    snapshot = _fleet({"a": 10, "b": 10, "c": 10}, {"a": [0.0], "b": [0.0], "c": [0.0]})
    state = ScaleState()
    counts = []
    for run in range(400):
        state, figure = _step(state, snapshot, None, run * RUN, CFG)
        counts.append(figure.desired)
    assert counts[0] == 3 and counts[-1] == 1 and len(_changes(counts)) == 1
    floor = ScaleSettings(min_workers=2, out_after=0.0, in_after=0.0)
    assert _step(ScaleState(), snapshot, None, 0.0, floor)[1].desired == 2


def test_without_a_capacity_estimate_the_count_holds() -> None:
    # Default-metric workers and no host limit: nothing says what a worker can carry.
    leases = [LeaseView(f"l{i}", "a" if i % 2 else "b", throughput_kbps=300.0) for i in range(6)]
    snapshot = Snapshot.of(leases, [WorkerView("a"), WorkerView("b")])
    state = ScaleState()
    for run in range(200):
        state, figure = _step(state, snapshot, None, run * RUN, CFG)
    assert figure.desired == 2 and figure.capacity_kbps is None
    assert "no capacity estimate" in figure.reasons[0]


def test_a_growing_lag_asks_for_one_worker_more_even_when_cpu_looks_fine() -> None:
    # Two workers at 30 % CPU with room to spare (need 1), but the largest lag grows 1 s every run of 2 s.
    snapshot = _fleet({"a": 30, "b": 30}, {"a": [200], "b": [200]})
    state, counts = ScaleState(), []
    for run in range(80):
        lag = LAG_FLOOR_MILLIS + 1000 * run
        state, figure = _step(state, snapshot, lag, run * RUN, CFG)
        counts.append(figure.desired)
    assert counts[0] == 2 and counts[-1] == 3, counts
    assert any("lag growing" in reason for reason in figure.reasons)
    first = counts.index(3)
    # Half a window of growth to call it a trend, then the scale-out window.
    assert (first * RUN) == CFG.out_after / 2 + CFG.out_after
    # A lag that stays high but does not grow asks for nothing more.
    state = ScaleState()
    for run in range(80):
        state, figure = _step(state, snapshot, 60_000, run * RUN, CFG)
    assert figure.desired == 2


def test_the_removal_candidate_moves_cheapest_never_drains_and_sticks() -> None:
    leases = [LeaseView("l1", "a", throughput_kbps=100.0), LeaseView("l2", "a", throughput_kbps=100.0),
              LeaseView("l3", "b", throughput_kbps=500.0), LeaseView("l4", "c", throughput_kbps=50.0),
              LeaseView("l5", "d", throughput_kbps=1.0)]
    workers = [WorkerView("a"), WorkerView("b"), WorkerView("c"), WorkerView("d", draining=True)]
    snapshot = Snapshot.of(leases, workers)
    assert removal_candidate(snapshot, None) == "c"  # one lease, least throughput; d drains
    assert removal_candidate(snapshot, "b") == "b"  # as few leases as the cheapest: stays
    assert removal_candidate(snapshot, "a") == "c"  # more leases than the cheapest: replaced
    assert removal_candidate(snapshot, "d") == "c"
    tied = Snapshot.of([], [WorkerView("y"), WorkerView("x")])
    assert removal_candidate(tied, None) == "x"


def test_settings_are_validated_and_reach_the_model() -> None:
    settings_ = load_settings(application_name="scale-test", scale_target_utilisation_percentage=60,
                              scale_min_workers=2, scale_max_workers=9, scale_out_after_millis=30_000,
                              scale_in_after_millis=120_000)
    cfg = ScaleSettings.from_settings(settings_)
    assert (cfg.target_percentage, cfg.min_workers, cfg.max_workers, cfg.out_after, cfg.in_after) == (
        60, 2, 9, 30.0, 120.0)
    try:
        load_settings(application_name="scale-test", scale_min_workers=5, scale_max_workers=4)
    except Exception as exc:  # ConfigError naming both settings
        assert "scale_min_workers" in str(exc) and "scale_max_workers" in str(exc)
    else:
        raise AssertionError("min above max was accepted")


def test_runs_without_an_estimate_neither_ask_for_fewer_nor_cancel_a_pending_change() -> None:
    """Workers hovering near their base give an estimate in some runs only (seen live): those runs stay neutral."""
    known = _fleet({"a": 20, "b": 20, "c": 20}, {"a": [100], "b": [100], "c": [100]})  # need 1 of 3
    unknown = _fleet({"a": 11, "b": 11, "c": 11}, {"a": [100], "b": [100], "c": [100]})  # 1 point: no estimate
    state, counts = ScaleState(), []
    for run in range(200):
        state, figure = _step(state, known if run % 2 else unknown, None, run * RUN, CFG)
        counts.append(figure.desired)
    assert counts[0] == 3 and counts[-1] == 1 and len(_changes(counts)) == 1, counts
    assert (_changes(counts)[0][0] - 1) * RUN == CFG.in_after  # the window counted from the first ask
    # A fleet that asked for more and has not got it yet: a run without an estimate does not ask for fewer.
    state = ScaleState(desired=5)
    state, figure = _step(state, unknown, None, 0.0, CFG)
    assert figure.desired == 5 and state.pending == 0


def test_a_new_term_continues_a_fresh_published_count_within_the_bounds() -> None:
    assert inherited(None, 1_000.0, CFG) == ScaleState()
    assert inherited((7, "w3", 990.0), 1_000.0, CFG) == ScaleState(desired=7, remove_first="w3")
    assert inherited((70, None, 990.0), 1_000.0, CFG).desired == CFG.max_workers  # the bounds may have changed
    assert inherited((7, "w3", 1_000.0 - CFG.in_after - 1), 1_000.0, CFG) == ScaleState()  # stale: start afresh
    assert inherited((7, "w3", 1_010.0), 1_000.0, CFG).desired == 7  # the old leader's clock a little ahead
    assert inherited((7, "w3", 1_000.0 + CFG.out_after + 1), 1_000.0, CFG) == ScaleState()  # a clock stepped
