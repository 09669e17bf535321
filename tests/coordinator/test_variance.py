import dataclasses
import math

import pytest

from shardherd.coordinator.decide import decide
from shardherd.coordinator.decider_config import DeciderConfig as _DeciderConfig
from shardherd.coordinator.decider_config import Strategy
from shardherd.coordinator.moves import MoveReason, Plan, UnplacedReason
from shardherd.coordinator.snapshot import LeaseView, Snapshot, WorkerView
from shardherd.shared.worker_metrics import WorkerStatus, classify, ema, room
from tests.coordinator.test_decide import counts, cpu, default, owned


def DeciderConfig(**settings: object) -> _DeciderConfig:  # noqa: N802 - reads like the class it builds
    """These tests cover strategy `kcl-variance` (`variance_balancing = kcl`); `band` is in test_band_balance.py."""
    return _DeciderConfig(strategy=Strategy.KCL_VARIANCE, **settings)  # type: ignore[arg-type]


# KCL's own tests run with dampening 80; dead band 0 switches off shardherd's churn guard to match KCL exactly.
# KCL's own semantics (its tests use dampening 80): no dead-band, no band floor, receivers stop at the average.
KCL_TESTS = DeciderConfig(dampening_percentage=80, rebalance_dead_band_percentage=0, rebalance_min_band_points=0,
                          allow_receiver_above_average=False)


@pytest.mark.parametrize(
    ("history", "alpha", "expected"),
    [
        ((10.0, 20.0), 0.5, 15.0),  # 0.5*20 + 0.5*10
        ((-1.0, 10.0, 20.0), 0.5, 15.0),  # leading failure skipped, first real sample taken as is
        ((10.0, -1.0, 30.0), 0.5, 20.0),  # 0.5*30 + 0.5*10
        ((10.0, 20.0), 0.2, 12.0),  # 0.2*20 + 0.8*10
        ((40.0, 80.0, 60.0), 0.5, 60.0),  # 40 -> 0.5*80 + 0.5*40 = 60 -> 0.5*60 + 0.5*60 = 60
        ((), 0.5, 0.0),
        ((-1.0, -1.0), 0.5, 0.0),
    ],
)
def test_ema(history: tuple[float, ...], alpha: float, expected: float) -> None:
    assert ema(history, alpha) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("worker", "status"),
    [
        (WorkerView("w"), WorkerStatus.ACTIVE),
        (WorkerView("w", {"C": (10.0,)}, {"C": (80.0,)}), WorkerStatus.ACTIVE),
        (WorkerView("w", {"C": (-1.0, 10.0)}, {"C": (80.0,)}), WorkerStatus.ACTIVE),
        (WorkerView("w", {"C": (10.0, -1.0)}, {"C": (80.0,)}), WorkerStatus.FAILING_METRIC),
        (WorkerView("w", {"C": (10.0,)}, {"M": (80.0,)}), WorkerStatus.INVALID_METRICS),
        (WorkerView("w", {"C": (10.0,)}, {"C": (0.0,)}), WorkerStatus.INVALID_METRICS),
        (WorkerView("w", {"C": (10.0,)}, {"C": ()}), WorkerStatus.INVALID_METRICS),
        (WorkerView("w", {"C": (math.nan,)}, {"C": (80.0,)}), WorkerStatus.INVALID_METRICS),
        (WorkerView("w", {"C": (-5.0,)}, {"C": (80.0,)}), WorkerStatus.INVALID_METRICS),
        (WorkerView("w", {}, {"C": (80.0,)}), WorkerStatus.INVALID_METRICS),
    ],
)
def test_classify(worker: WorkerView, status: WorkerStatus) -> None:
    assert classify(worker) is status


@pytest.mark.parametrize(
    ("values", "averages", "expected"),
    [
        ({"C": 50.0}, {"C": 70.0}, 0.4),  # (70 - 50) / 50
        ({"C": 90.0}, {"C": 70.0}, -20 / 90),
        ({"C": 0.0}, {"C": 70.0}, math.inf),  # KCL says 1.0, which ranks an idle worker below a busy one
        ({"C": 0.0}, {"C": 0.0}, 0.0),
        ({"C": 50.0, "M": 60.0}, {"C": 70.0, "M": 66.0}, 0.1),  # min(0.4, 6/60)
    ],
)
def test_room(values: dict[str, float], averages: dict[str, float], expected: float) -> None:
    assert room(values, averages) == pytest.approx(expected)


def test_kcl_example_budget_admits_only_smallest_lease() -> None:
    # KCL example 1: avg (90+50)/2 = 70, band [63, 77]. Budget 1000 * (90-70)/90 * 0.8 = 177.8: 400, 300, 200 do
    # not fit (177.8 - x <= 0), 100 does. T = 250 * 4 / 2 = 500, receiver 50 + 100 * 70/500 = 64 <= 70.
    leases = [owned(f"l{t}", "yield", float(t)) for t in (100, 200, 300, 400)]
    plan = decide(Snapshot.of(leases, [cpu("yield", 90, 80), cpu("take", 50, 80)]), KCL_TESTS, balance=True)
    assert [(m.lease_key, m.from_owner, m.to_worker, m.reason) for m in plan.moves] == [
        ("l100", "yield", "take", MoveReason.BALANCE_CPU)
    ]
    after = {w.worker_id: w.metrics_after["C"] for w in plan.workers}
    assert after["take"] == pytest.approx(64.0)
    assert after["yield"] == pytest.approx(81.0)  # shardherd lowers the donor: 90 - 90 * 100/1000
    assert "budget 177.8" in plan.moves[0].detail


def test_kcl_example_receiver_fills_up_to_average() -> None:
    # KCL example 2. Throughputs: 1000 + 7 x 10 known, mean 1070/8 = 133.75 given to the unassigned lease.
    # T = 133.75 * 9 / 2 = 601.875. Priority: take (room 0.4) gets T1: 50 + 133.75 * 70/601.875 = 65.556.
    # Budget 1070 * 20/90 * 0.8 = 190.2: the 1000 lease does not fit, all seven 10s do. Each adds 700/601.875 = 1.163:
    # 66.72, 67.88, 69.04 accepted, 70.21 > 70 rejected -> 3 balancing moves.
    leases = [owned("Y1", "yield", 1000.0), LeaseView("T1")] + [
        owned(f"Y{i}", "yield", 10.0) for i in (2, 3, 5, 6, 7, 8, 9)
    ]
    plan = decide(Snapshot.of(leases, [cpu("yield", 90, 80), cpu("take", 50, 80)]), KCL_TESTS, balance=True)
    reasons = [m.reason for m in plan.moves]
    assert reasons == [MoveReason.UNASSIGNED] + [MoveReason.BALANCE_CPU] * 3
    assert plan.moves[0].lease_key == "T1" and plan.moves[0].to_worker == "take"
    assert counts(plan)["take"] == 4
    take = next(w for w in plan.workers if w.worker_id == "take")
    assert take.metrics_after["C"] == pytest.approx(50 + 133.75 * 70 / 601.875 + 3 * 700 / 601.875)
    assert "budget 190.2" in plan.moves[1].detail


def _hot_worker_inside_band() -> Snapshot:
    # KCL example 3 with threshold 20: avg (59+41)/2 = 50, band [40, 60]; "hot" is inside it but above its
    # operating range 50, so it donates: 1001 * 9/59 * 0.8 = 122.2 -> only the 1 KiB/s lease fits.
    leases = [owned("small", "hot", 1.0), owned("big", "hot", 1000.0)]
    return Snapshot.of(leases, [cpu("hot", 59, 50), cpu("take", 41)])


def test_kcl_example_worker_above_operating_range_donates() -> None:
    config = DeciderConfig(dampening_percentage=80, rebalance_threshold_percentage=20, rebalance_dead_band_percentage=0)
    plan = decide(_hot_worker_inside_band(), config, balance=True)
    assert [(m.lease_key, m.to_worker) for m in plan.moves] == [("small", "take")]


def test_dead_band_suppresses_negligible_move() -> None:
    # Same case with the default 2 % dead band: moving 1 KiB/s lowers hot by 59 * 1/1001 = 0.059 and raises take by
    # 1 * 50/500.5 = 0.0999; 0.159 is 0.32 % of the average 50 < 2 % -> no move (KCL would churn it; issue #1814).
    config = DeciderConfig(dampening_percentage=80, rebalance_threshold_percentage=20)
    plan = decide(_hot_worker_inside_band(), config, balance=True)
    assert plan.moves == ()


@pytest.mark.parametrize(("overshoot", "expected"), [(False, []), (True, [("lease2", "take")])])
def test_overshoot_takes_smallest_lease(overshoot: bool, expected: list[tuple[str, str]]) -> None:
    # Budget 900 * 20/90 * 0.8 = 160 is below every yield lease (299, 300, 301). With overshoot the smallest (299)
    # moves: T = 975 * 4 / 2 = 1950, take 50 + 299 * 70/1950 = 60.7 <= 70.
    leases = [owned("lease1", "yield", 300.0), owned("lease2", "yield", 299.0), owned("lease3", "yield", 301.0)]
    leases.append(owned("lease4", "take", 3000.0))
    config = DeciderConfig(dampening_percentage=80, allow_throughput_overshoot=overshoot)
    plan = decide(Snapshot.of(leases, [cpu("yield", 90), cpu("take", 50)]), config, balance=True)
    assert [(m.lease_key, m.to_worker) for m in plan.moves] == expected


def test_no_balancing_on_non_balancing_run() -> None:
    leases = [owned(f"l{t}", "yield", float(t)) for t in (100, 200, 300, 400)]
    plan = decide(Snapshot.of(leases, [cpu("yield", 90, 80), cpu("take", 50, 80)]), KCL_TESTS, balance=False)
    assert plan.moves == () and not plan.balanced


def test_receiver_rejecting_big_lease_still_takes_small_one() -> None:
    # avg (140+40)/2 = 90. Donor budget 150 * 50/140 * 1.0 = 53.6: 100 does not fit, 45 does (8.6 left), 5 does.
    # T = 50 * 3 / 2 = 75. take + 45 -> 40 + 45 * 90/75 = 94 > 90: rejected. KCL would end the donor here and drop
    # the receiver; shardherd tries the 5 KiB/s lease: 40 + 6 = 46 <= 90.
    leases = [owned("filler", "hot", 100.0), owned("big", "hot", 45.0), owned("small", "hot", 5.0)]
    config = DeciderConfig(dampening_percentage=100, allow_receiver_above_average=False)
    plan = decide(Snapshot.of(leases, [cpu("hot", 140, 200), cpu("take", 40)]), config, balance=True)
    assert [(m.lease_key, m.to_worker) for m in plan.moves] == [("small", "take")]


def test_receiver_may_pass_the_average_inside_the_band_when_it_narrows_the_spread() -> None:
    # Same fleet with the default rule: take + big = 94 > avg 90 but < upper band 99, and the donor drops by
    # 140 * 45/150 = 42 to 98 >= 94, so the move is made (spread 140/40 becomes 98/94). The 5 KiB/s lease then
    # finds no room (budget 53.6 - 45 = 8.6 would allow it, but take + 6 = 100 is above the band).
    leases = [owned("filler", "hot", 100.0), owned("big", "hot", 45.0), owned("small", "hot", 5.0)]
    plan = decide(Snapshot.of(leases, [cpu("hot", 140, 200), cpu("take", 40)]), DeciderConfig(dampening_percentage=100),
                  balance=True)
    assert [(m.lease_key, m.to_worker) for m in plan.moves] == [("big", "take")]
    after = {w.worker_id: w.metrics_after["C"] for w in plan.workers}
    assert after == {"hot": pytest.approx(98.0), "take": pytest.approx(94.0)}


def test_reports_that_lag_behind_a_move_are_caught_up_from_the_throughput_history() -> None:
    # hot reports 90 and cold 10 while they carried 90 and 10 KiB/s (CPU = throughput here); the leader has since
    # moved the 40 KiB/s lease z, so they carry 50 each. Without the history the decider believes the stale 90/10.
    leases = [owned("x", "hot", 50.0), owned("y", "cold", 10.0), owned("z", "cold", 40.0)]
    fleet = [cpu("hot", 90), cpu("cold", 10)]
    stale = decide(Snapshot.of(leases, fleet), DeciderConfig(), balance=True)
    assert {w.worker_id: w.metrics_before["C"] for w in stale.workers} == {"hot": 90.0, "cold": 10.0}
    # With it: slope = avg 50 / 50 KiB/s carried per worker = 1, so hot 90 + (50 - 90) = 50, cold 10 + 40 = 50.
    caught_up = [dataclasses.replace(fleet[0], throughput_history=(90.0, 90.0)),
                 dataclasses.replace(fleet[1], throughput_history=(10.0, 10.0))]
    plan = decide(Snapshot.of(leases, caught_up), DeciderConfig(), balance=True)
    assert plan.moves == () and plan.averages == {"C": pytest.approx(50.0)}
    assert {w.worker_id: w.metrics_after["C"] for w in plan.workers} == {"hot": pytest.approx(50.0),
                                                                         "cold": pytest.approx(50.0)}


def test_band_floor_ignores_noise_on_an_idle_fleet() -> None:
    # avg 10, 10 % band would be +-1; the 2-point floor (and twice the 2-point minimum gain) widens it, so 11.5 / 8.5
    # is balanced.
    leases = [owned("a", "w1", 1.0), owned("b", "w2", 1.0)]
    workers = [cpu("w1", 11.5), cpu("w2", 8.5)]
    with_floor = decide(Snapshot.of(leases, workers), DeciderConfig(), balance=True)
    assert with_floor.moves == () and "balancing: no metric out of band" in with_floor.notes
    no_floor = decide(Snapshot.of(leases, workers),
                      DeciderConfig(rebalance_min_band_points=0, rebalance_min_gain_points=0), balance=True)
    assert any(note.startswith("balancing C: avg 10.00, band [9.00, 11.00]") for note in no_floor.notes)


def test_equal_workers_share_leases_deterministically() -> None:
    # Three identical metric-less workers, nine unassigned leases, no throughput anywhere. KCL's NaN rooms and heap
    # ties give everything to two workers; here every lease weighs 1 and ties break on lease count.
    leases = [LeaseView(f"l{i}") for i in range(9)]
    plan = decide(Snapshot.of(leases, [default("a"), default("b"), default("c")]), DeciderConfig(), balance=True)
    assert counts(plan) == {"a": 3, "b": 3, "c": 3}
    assert [m.to_worker for m in plan.moves[:3]] == ["a", "b", "c"]
    assert all(math.isfinite(v) for w in plan.workers for v in w.metrics_after.values())


def test_idle_stream_balances_lease_counts() -> None:
    # All throughput 0: weights 1, T = 8/4 = 2, a holds 8 -> 100 * 8/2 = 400, others 0, avg(T) = 100.
    # Budget 8 * (400-100)/400 * 0.6 = 3.6 -> three leases (3.6 -> 2.6 -> 1.6 -> 0.6). Each receiver rises by
    # 100 * 1/2 = 50 <= 100; idle receivers have infinite room, ties broken by count then id -> b, c, d.
    leases = [owned(f"l{i}", "a", 0.0) for i in range(8)]
    workers = [default(w) for w in "abcd"]
    plan = decide(Snapshot.of(leases, workers), DeciderConfig(), balance=True)
    assert sorted(m.to_worker for m in plan.moves) == ["b", "c", "d"]
    assert {m.reason for m in plan.moves} == {MoveReason.BALANCE_THROUGHPUT}
    assert any("every lease weighs 1" in note for note in plan.notes)
    assert plan.averages["T"] == pytest.approx(100.0)


def test_default_workers_balance_by_throughput_share() -> None:
    # T = 100 * 4 / 2 = 200; a carries 350 -> 175, b 50 -> 25; avg 100. Budget 350 * 75/175 * 0.6 = 90:
    # largest first, 300 no, 50 yes (40 left). b + 50 -> 25 + 100 * 50/200 = 50 <= 100.
    leases = [owned("x", "a", 300.0), owned("y", "a", 50.0), owned("z", "b", 50.0), owned("u", "b", 0.0)]
    plan = decide(Snapshot.of(leases, [default("a"), default("b")]), DeciderConfig(), balance=True)
    assert [(m.lease_key, m.to_worker, m.reason) for m in plan.moves] == [("y", "b", MoveReason.BALANCE_THROUGHPUT)]


def test_expired_leases_oldest_first_and_spillover() -> None:
    leases = [
        owned("recent", "dead", 1.0, expired=True, silent_ms=5_000),
        owned("old", "dead", 1.0, expired=True, silent_ms=9_000),
        LeaseView("new"),
    ]
    config = DeciderConfig(max_leases_for_worker=2)
    plan = decide(Snapshot.of(leases, [cpu("w", 10)]), config, balance=False)
    assert [(m.lease_key, m.reason) for m in plan.moves] == [
        ("new", MoveReason.UNASSIGNED),
        ("old", MoveReason.EXPIRED),
    ]
    assert [(u.lease_key, u.owner, u.reason) for u in plan.spillover] == [
        ("recent", "dead", UnplacedReason.NO_CAPACITY)
    ]


def test_no_active_worker_spills_everything() -> None:
    plan = decide(Snapshot.of([LeaseView("a")], [cpu("w", 10, draining=True)]), DeciderConfig(), balance=True)
    assert [(u.lease_key, u.reason) for u in plan.spillover] == [("a", UnplacedReason.NO_ACTIVE_WORKER)]


def test_invalid_and_failing_workers_receive_nothing() -> None:
    workers = [
        cpu("good", 60),
        WorkerView("failing", {"C": (1.0, -1.0)}, {"C": (100.0,)}),
        WorkerView("broken", {"C": (1.0,)}, {"C": (0.0,)}),
    ]
    plan = decide(Snapshot.of([LeaseView(f"l{i}") for i in range(4)], workers), DeciderConfig(), balance=True)
    assert {m.to_worker for m in plan.moves} == {"good"}
    status = {w.worker_id: w.status for w in plan.workers}
    assert status == {
        "good": WorkerStatus.ACTIVE,
        "failing": WorkerStatus.FAILING_METRIC,
        "broken": WorkerStatus.INVALID_METRICS,
    }


def test_drain_moves_everything_first_even_without_balancing() -> None:
    leases = [
        owned("d1", "old", 30.0),
        owned("d2", "old", 10.0),
        owned("stuck", "old", 5.0, checkpoint_owner="old", handoff_blocked=True),
        LeaseView("fresh"),
    ]
    workers = [default("old", draining=True), default("a"), default("b")]
    plan = decide(Snapshot.of(leases, workers), DeciderConfig(), balance=False)
    reasons = {m.lease_key: m.reason for m in plan.moves}
    assert reasons == {"fresh": MoveReason.UNASSIGNED, "d1": MoveReason.DRAIN, "d2": MoveReason.DRAIN}
    assert "old" not in {m.to_worker for m in plan.moves}
    assert [(u.lease_key, u.reason) for u in plan.held] == [("stuck", UnplacedReason.HANDOFF_PENDING)]
    # Largest drained lease first, to the worker with most room; the second goes to the other worker.
    assert {plan.moves[1].to_worker, plan.moves[2].to_worker} == {"a", "b"}


def test_pinned_lease_is_not_balanced() -> None:
    # As the first example, but l100 is pinned by a pending handoff: no other lease fits the 177.8 budget, the
    # overshoot lease (200) would lift take to 50 + 200 * 70/500 = 78 > 70, so nothing moves.
    leases = [owned(f"l{t}", "yield", float(t)) for t in (200, 300, 400)]
    leases.append(owned("l100", "take", 100.0, checkpoint_owner="yield", handoff_blocked=True))
    plan = decide(Snapshot.of(leases, [cpu("yield", 90, 80), cpu("take", 50, 80)]), KCL_TESTS, balance=True)
    assert plan.moves == ()


def test_finished_lease_is_assigned_like_any_other() -> None:
    plan = decide(Snapshot.of([LeaseView("done", finished=True)], [cpu("w", 10)]), DeciderConfig(), balance=False)
    assert [(m.lease_key, m.to_worker, m.reason) for m in plan.moves] == [("done", "w", MoveReason.UNASSIGNED)]


def test_expired_lease_avoids_the_owner_it_expired_under() -> None:
    # w has the most room, but the lease expired under w (alive, yet not renewing it): the next worker gets it.
    leases = [owned("e", "w", 5.0, expired=True, silent_ms=20_000)]
    plan = decide(Snapshot.of(leases, [cpu("w", 10), cpu("v", 80)]), DeciderConfig(), balance=False)
    assert [(m.from_owner, m.to_worker, m.reason) for m in plan.moves] == [("w", "v", MoveReason.EXPIRED)]


def test_expired_lease_returns_to_its_owner_when_no_other_worker_exists() -> None:
    leases = [owned("e", "w", 5.0, expired=True, silent_ms=20_000)]
    plan = decide(Snapshot.of(leases, [cpu("w", 10)]), DeciderConfig(), balance=False)
    assert [(m.from_owner, m.to_worker, m.reason) for m in plan.moves] == [("w", "w", MoveReason.EXPIRED)]


def test_throughput_cap_closes_worker_after_crossing() -> None:
    # KCL semantics kept: the cap is checked before adding, so the first lease may cross it.
    leases = [LeaseView(f"l{i}", throughput_kbps=60.0) for i in range(3)]
    plan = decide(Snapshot.of(leases, [cpu("w", 10)]), DeciderConfig(max_throughput_per_host_kbps=100), balance=False)
    assert len(plan.moves) == 2 and len(plan.spillover) == 1


def test_recently_moved_leases_are_left_alone_by_balancing_but_not_by_drain() -> None:
    # Same fleet as above: a 30 KiB/s lease would move from hot (90) to cold (10)...
    fresh = [owned("a", "hot", 30.0), owned("b", "hot", 30.0), owned("c", "hot", 30.0)]
    fleet = [cpu("hot", 90), cpu("cold", 10)]
    assert decide(Snapshot.of(fresh, fleet), DeciderConfig(), balance=True).moves
    # ... unless balancing just moved them here: then they stay (no ping-pong) ...
    cooling = [LeaseView(lease.key, lease.lease_owner, throughput_kbps=30.0, recently_moved=True) for lease in fresh]
    assert decide(Snapshot.of(cooling, fleet), DeciderConfig(), balance=True).moves == ()
    # ... while a drain still moves every one of them.
    draining = [cpu("hot", 90, draining=True), cpu("cold", 10)]
    plan = decide(Snapshot.of(cooling, draining), DeciderConfig(), balance=True)
    assert {(m.lease_key, m.reason) for m in plan.moves} == {(k, MoveReason.DRAIN) for k in ("a", "b", "c")}


def test_a_worker_with_a_late_heartbeat_gets_unowned_leases_only_if_no_worker_is_fresh() -> None:
    late = dataclasses.replace(cpu("late", 10.0), stale=True)
    fresh = plan_for([LeaseView("x")], [late, cpu("fresh", 50.0)])
    assert [(m.lease_key, m.to_worker) for m in fresh.moves] == [("x", "fresh")]  # though "late" has more room
    only_late = plan_for([LeaseView("x")], [late])
    assert [(m.lease_key, m.to_worker) for m in only_late.moves] == [("x", "late")]  # an owner beats none


def plan_for(leases: list[LeaseView], workers: list[WorkerView]) -> Plan:
    return decide(Snapshot.of(leases, workers), DeciderConfig(), balance=True)
