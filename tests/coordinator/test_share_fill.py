"""With every worker inside its CPU band, band balancing fills a new or idle worker on throughput
(coordinator/deciders/band.py `balance_pass`; `rebalance_fill_on_throughput`; decisions 0014, 0020).

Live (`python -m bench.churn --scenario add-agent`, CPU metrics on): the added agent reported 0.3 % CPU against
2.6-3.8 % for the others. The CPU band (+-4 points: twice the minimum gain) is wider than that whole range, so the
fleet counted as balanced and the new agent got no lease.
"""

from __future__ import annotations

import dataclasses

from shardherd.coordinator.decide import decide
from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.moves import MoveReason, Plan
from shardherd.coordinator.snapshot import LeaseView, Snapshot, WorkerView
from shardherd.shared.worker import THROUGHPUT_METRIC

# The local stack's shards (KiB/s, as bench/fleet_noise.py has them) on three agents; D joins.
HELD = {"A": {"s0": 1.11, "s1": 1.20, "s2": 1.60}, "B": {"s3": 0.65, "s4": 1.65, "s5": 3.60},
        "C": {"s6": 0.81, "s7": 1.49}}
CONFIG = DeciderConfig(rebalance_persistent_reports=8)  # worker mode: 30 s of reports about 4 s apart


def _fleet(cpu: dict[str, float], held: dict[str, dict[str, float]] = HELD,
           carried: dict[str, list[float]] | None = None) -> Snapshot:
    """Workers with a flat CPU history (10 reports) and the leases of `held`; each carried what it holds now at each
    report unless `carried` gives its history."""
    leases = [LeaseView(key, lease_owner=wid, throughput_kbps=kbps) for wid, own in held.items()
              for key, kbps in own.items()]
    past = carried or {}
    workers = [WorkerView(wid, {"C": (value,) * 10}, {"C": (100.0,)},
                          throughput_history=tuple(past.get(wid, [sum(held.get(wid, {}).values())] * 10)))
               for wid, value in cpu.items()]
    return Snapshot.of(leases, workers)


def _moves(plan: Plan) -> list[tuple[str, str | None, str]]:
    return [(m.lease_key, m.from_owner, m.to_worker) for m in plan.moves]


def test_a_new_agent_the_cpu_band_cannot_see_is_filled_on_throughput() -> None:
    snapshot = _fleet({"A": 3.0, "B": 3.8, "C": 2.6, "D": 0.3})
    plan = decide(snapshot, CONFIG, balance=True)
    # 12.11 KiB/s over 4 agents: 3.03 each, band +-33 % (twice the 0.5 KiB/s minimum gain), floor 31 % of a share.
    # D takes from B (145 % of a share) the lease landing it nearest the average, 3.60 KiB/s (119 %) in one run.
    assert _moves(plan) == [("s5", "B", "D")]
    assert {m.reason for m in plan.moves} == {MoveReason.BALANCE_THROUGHPUT}
    assert any("filling on T" in note for note in plan.notes)
    # The plan shows the CPU only, as for any CPU-reporting worker; D's projected CPU rose with the lease.
    after = {w.worker_id: w.metrics_after for w in plan.workers}
    assert all(THROUGHPUT_METRIC not in values for values in after.values())
    assert after["D"]["C"] > 0.3 and THROUGHPUT_METRIC not in plan.averages
    # Off: the fleet counts as balanced, as KCL's CPU band would (and as it did before).
    off = DeciderConfig(rebalance_persistent_reports=8, rebalance_fill_on_throughput=False)
    assert decide(snapshot, off, balance=True).moves == ()
    assert decide(snapshot, CONFIG, balance=False).moves == ()  # only on balancing runs


def test_once_filled_nothing_moves_on_throughput_again() -> None:
    # After the move above: D at 119 %, B at 27 % of a share (less than the floor would be only below 31 %).
    held = {**HELD, "B": {"s3": 0.65, "s4": 1.65}, "D": {"s5": 3.60}}
    assert decide(_fleet({"A": 3.0, "B": 3.0, "C": 2.6, "D": 3.4}, held), CONFIG, balance=True).moves == ()
    # Uneven throughput is not filled or shed: C at 48 %, D at 49 % and B at 173 % of a share stay as they are.
    uneven = {**HELD, "B": {"s4": 1.65, "s5": 3.60}, "C": {"s6": 0.81, "s3": 0.65}, "D": {"s7": 1.49}}
    assert decide(_fleet({"A": 3.0, "B": 3.8, "C": 2.6, "D": 2.0}, uneven), CONFIG, balance=True).moves == ()


def test_a_joining_worker_is_filled_on_what_it_carries_now() -> None:
    # D's leases just moved away (A, B and C hold all eight); at its earlier reports it carried 2.30 KiB/s. A share
    # is a lease figure, not a noisy report: D is filled on what it holds now, as a worker that never held anything
    # (decision 0046; the fill used to wait until no report of the window showed D's old leases).
    held = {"A": {"s0": 1.11, "s1": 1.20, "s2": 1.60}, "B": {"s3": 0.65, "s4": 1.65, "s5": 3.60},
            "C": {"s6": 0.81, "s7": 1.49}, "D": {}}
    cpu = {"A": 3.0, "B": 3.8, "C": 2.6, "D": 0.3}
    moved = decide(_fleet(cpu, held, {"D": [2.30] * 9 + [0.0]}), CONFIG, balance=True)
    assert _moves(moved) == _moves(decide(_fleet(cpu, held, {"D": [0.0] * 10}), CONFIG, balance=True))
    assert [m.to_worker for m in moved.moves] == ["D"]


def test_a_worker_carrying_half_a_share_or_more_is_not_filled_on_throughput() -> None:
    # C's leases carry 55 % of a share: not a joining worker; the CPU, level with the others', is what counts.
    held = {**HELD, "C": {"s6": 1.2, "s7": 1.0}}
    assert decide(_fleet({"A": 3.0, "B": 3.8, "C": 3.0}, held), CONFIG, balance=True).moves == ()


def test_a_joining_worker_busy_by_its_own_cpu_is_filled_below_its_operating_range() -> None:
    # A Spark driver's agent reports more CPU than the others while it holds nothing (the driver's own JVM): it still
    # gets its share of the throughput (issues 31 and 33: such a driver got no lease in 40-60 s). Its own load above
    # the fleet's base raises its ceiling by as much: it takes what an average worker carries.
    plan = decide(_fleet({"A": 3.0, "B": 3.0, "C": 2.6, "D": 5.0}), CONFIG, balance=True)
    assert [m.to_worker for m in plan.moves] == ["D"]
    busy = decide(_fleet({"A": 3.0, "B": 3.0, "C": 2.6, "D": 7.4}), CONFIG, balance=True)
    assert _moves(busy) == [("s5", "B", "D")]
    # Above the band while holding nothing: with its first reports (fewer than load_model.MIN_OWN_REPORTS) the CPU
    # pass has nothing to move, so the fill runs (it used to wait for an in-band run that never came). With ten
    # reports at 0 KiB/s its CPU is known to be its own (decision 0044): the run that learns it fills D, and once the
    # leader keeps it (the next run's snapshot) the CPU band is quiet and the fill runs alone.
    first = _fleet({"A": 3.0, "B": 3.8, "C": 2.6, "D": 20.0}, carried={"D": [0.0] * 3})
    hot = decide(first, CONFIG, balance=True)
    assert _moves(hot) == [("s5", "B", "D")] and "nothing to move; filling on T" in hot.notes[0]
    learning = _fleet({"A": 3.0, "B": 3.8, "C": 2.6, "D": 20.0})
    learns = decide(learning, CONFIG, balance=True)
    assert _moves(learns) == [("s5", "B", "D")]
    learned = learns.own_excess
    assert learned["D"]["C"] > 15.0
    known = decide(dataclasses.replace(learning, own_excess=learned), CONFIG, balance=True)
    assert _moves(known) == [("s5", "B", "D")] and known.notes[0].startswith("balancing: no metric out of band")
    # Never past its operating range (100 % CPU).
    full = decide(_fleet({"A": 3.0, "B": 3.8, "C": 2.6, "D": 99.5}), CONFIG, balance=True)
    assert full.moves == () and all(w.metrics_after["C"] <= 100.0 for w in busy.workers + hot.workers)


def test_the_cpu_band_goes_first() -> None:
    # A worker out of the CPU band is balanced on CPU; the throughput fill waits for a run where none is.
    plan = decide(_fleet({"A": 12.0, "B": 3.8, "C": 2.6, "D": 0.3}), CONFIG, balance=True)
    assert plan.moves and {m.reason for m in plan.moves} == {MoveReason.BALANCE_CPU}


def test_a_mixed_fleet_is_balanced_on_throughput_share_already_and_the_fill_changes_nothing() -> None:
    # C reports no metric (KCL's default-metric worker), D is new. The fleet is balanced on the metric all share,
    # the throughput share `T` (coordinator/metric_basis.py), so D is filled by the band on `T` with or without the
    # fill on throughput.
    leases = [LeaseView(key, lease_owner=wid, throughput_kbps=kbps) for wid, own in HELD.items()
              for key, kbps in own.items()]
    workers = [WorkerView("A", {"C": (3.0,) * 10}, {"C": (100.0,)}, throughput_history=(3.91,) * 10),
               WorkerView("B", {"C": (3.8,) * 10}, {"C": (100.0,)}, throughput_history=(5.90,) * 10),
               WorkerView("C"),
               WorkerView("D", {"C": (0.3,) * 10}, {"C": (100.0,)}, throughput_history=(0.0,) * 10)]
    snapshot = Snapshot.of(leases, workers)
    plan = decide(snapshot, CONFIG, balance=True)
    off = decide(snapshot, DeciderConfig(rebalance_persistent_reports=8, rebalance_fill_on_throughput=False),
                 balance=True)
    assert _moves(plan) == _moves(off) == [("s5", "B", "D")]
    assert plan.averages == off.averages == {THROUGHPUT_METRIC: 100.0}
