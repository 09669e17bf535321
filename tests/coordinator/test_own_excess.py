"""A worker's own CPU (a Spark driver's JVM beside plain agents) is learned from its reports and kept by the leader
(coordinator/load_model.py `own_base`, coordinator/deciders/fleet_state.py `FleetView`; decision 0044).

Live (`python -m bench.scale --shards 64 --agents 8 --spark-agents 2`, session 23): the Spark agents reported 13-19 %
CPU against 1-3 % for the plain ones. Band shed their leases for CPU (each priced at the worker's whole CPU over its
KiB/s) and filled them back as joiners on throughput: 61 owner changes in 10 minutes.
"""

from __future__ import annotations

import dataclasses

import pytest

from shardherd.coordinator.decide import decide
from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.load_model import Line, own_base
from shardherd.coordinator.moves import Move, Plan
from shardherd.coordinator.snapshot import LeaseView, Snapshot, WorkerView

CONFIG = DeciderConfig(rebalance_persistent_reports=8)  # worker mode: 30 s of reports about 4 s apart
LINE = Line(1.2, 5.7)  # the plain agents' CPU: 1.2 % with no lease, 5.7 points per KiB/s (the leader's last fit)
PLAIN = [f"p{i}" for i in range(8)]


def _fleet(spark_cpu: list[float], spark_kbps: list[float], spark_leases: int = 4,
           own_excess: dict[str, dict[str, float]] | None = None, streams: int = 0) -> Snapshot:
    """Eight plain agents, six leases of 0.07 KiB/s each at 1.2 + 5.7 x 0.42 % CPU, and agent S holding
    `spark_leases` leases with the CPU and KiB/s histories given (oldest first); with `streams`, multi-stream
    lease keys spread over that many streams."""
    def key(wid: str, n: int) -> str:
        return f"123456789012:s{n % streams}:1:{wid}-{n}" if streams else f"{wid}-{n}"

    leases = [LeaseView(key(wid, n), lease_owner=wid, throughput_kbps=0.07) for wid in PLAIN for n in range(6)]
    leases += [LeaseView(key("S", n), lease_owner="S", throughput_kbps=0.07) for n in range(spark_leases)]
    plain_cpu = LINE.base + LINE.slope * 0.42
    workers = [WorkerView(wid, {"C": (plain_cpu,) * 10}, {"C": (100.0,)}, throughput_history=(0.42,) * 10)
               for wid in PLAIN]
    workers.append(WorkerView("S", {"C": tuple(spark_cpu)}, {"C": (100.0,)}, throughput_history=tuple(spark_kbps)))
    return Snapshot.of(leases, workers, {"C": LINE}, own_excess)


def _sheds(plan: Plan) -> list[str]:
    return [move.lease_key for move in plan.moves if move.from_owner == "S"]


def test_a_worker_whose_cpu_stayed_when_it_gave_leases_away_keeps_the_rest() -> None:
    # S gave 2 of its 6 leases away (0.42 -> 0.28 KiB/s) and its CPU stayed at 16 %: the CPU is its own, not its
    # leases'. Before, each lease was priced at 14.8 points / 0.28 KiB/s, so S shed again (and was filled back later).
    plan = decide(_fleet([16.0] * 10, [0.42] * 5 + [0.28] * 5), CONFIG, balance=True)
    assert plan.moves == ()
    # Its base: its reports less 5.7 points per KiB/s carried, the lower of the two ends (13.606 at 0.42 KiB/s,
    # 14.404 at 0.28), 12.406 points above the plain agents' (1.2 %).
    assert plan.own_excess["S"]["C"] == pytest.approx(12.406)
    summary = {w.worker_id: w for w in plan.workers}["S"]
    # The plan shows S's value as reported (its moving average caught up with the last 0.004 KiB/s its reports lag).
    assert summary.metrics_before["C"] == pytest.approx(16.0 - 5.7 * 0.0044, abs=0.001)


def test_the_leader_keeps_what_the_reports_no_longer_show() -> None:
    # Ten reports later the history shows S steady at 0.28 KiB/s: nothing to learn from it. Without the kept excess
    # S sheds (a shed is the experiment that tells a JVM from costly leases); with it, nothing moves.
    steady = ([16.0] * 10, [0.28] * 10)
    assert _sheds(decide(_fleet(*steady), CONFIG, balance=True))
    kept = decide(_fleet(*steady, own_excess={"S": {"C": 12.4}}), CONFIG, balance=True)
    assert kept.moves == () and kept.own_excess == {"S": {"C": 12.4}}


def test_costly_leases_are_still_shed() -> None:
    # S's CPU fell with its throughput (16 % -> 11 %): its leases cost 36 points per KiB/s, and their CPU is theirs.
    plan = decide(_fleet([16.0] * 5 + [11.0] * 5, [0.42] * 5 + [0.28] * 5), CONFIG, balance=True)
    assert _sheds(plan) and "S" not in plan.own_excess
    # Decision 0013's case: equal throughput, more CPU, no change to learn from: shed as before.
    assert _sheds(decide(_fleet([11.0] * 10, [0.42] * 10, spark_leases=6), CONFIG, balance=True))


def test_a_kept_excess_counts_only_as_far_as_the_newest_reports_show_it() -> None:
    # S's JVM went (its CPU is a plain agent's again): the kept 12.4 points would make it look idle, so they are
    # believed only up to its value less what its leases add (nothing here); S then takes no extra lease.
    plan = decide(_fleet([LINE.base + LINE.slope * 0.28] * 10, [0.28] * 10, own_excess={"S": {"C": 12.4}}),
                  CONFIG, balance=True)
    assert plan.moves == ()
    assert {w.worker_id: w for w in plan.workers}["S"].metrics_before["C"] == pytest.approx(2.796)


@pytest.mark.parametrize(("cpu", "streams"), [(16.0, 0), (40.0, 0), (40.0, 2)])
def test_a_shed_on_cpu_gives_no_lease_the_fill_on_shares_gives_back(cpu: float, streams: int) -> None:
    # Session 26, live 256 shards x 34 agents: the leader had learned only part of a Spark agent's JVM (here 4 of
    # 12.4 points); the rest put it above the CPU band. The shed priced it at the agent's leases and took it to half
    # the average lease count, where the fill on shares counts its CPU above the line as its own (`joiner_ceiling`)
    # and filled it back: shed 2, shed 2, fill 4, ... on the same reports. Now the shed gives no lease the fill would
    # give back (`BandPass._unrefilled`). At 40 % S sheds in one batch (each lease keeps it above the band), and each
    # lease is judged on the count as the batch moves leases, in a multi-stream application too (where the shed
    # orders its leases to spread each stream first; before, that order judged them all at 6 leases: S shed 4 and
    # the fill on shares gave 3 back in the same plan, and S shed 2 in the next).
    snapshot = _fleet([cpu] * 10, [0.42] * 10, spark_leases=6, own_excess={"S": {"C": 4.0}}, streams=streams)
    moves: list[Move] = []
    for _ in range(4):  # each plan applied (its moved leases left alone by the next run, as the leader does)
        plan = decide(snapshot, CONFIG, balance=True)
        moves += plan.moves
        to = {move.lease_key: move.to_worker for move in plan.moves}
        leases = [dataclasses.replace(lease, lease_owner=to.get(lease.key, lease.lease_owner),
                                      recently_moved=lease.key in to) for lease in snapshot.leases]
        snapshot = Snapshot.of(leases, snapshot.workers, {"C": LINE}, plan.own_excess)
    # 6 -> 3 leases: half an average count (54 / 9), a share of 50, which the fill on shares leaves alone; the
    # next lease would take S under it, and S's CPU above the line would let the fill give one back.
    assert [move.from_owner for move in moves] == ["S", "S", "S"]
    assert sum(lease.lease_owner == "S" for lease in snapshot.leases) == 3


def test_the_cpu_fill_takes_no_lease_the_fill_on_shares_gives_back() -> None:
    # S holds 11 of 59 leases at 92 % CPU, none of it learned as its own yet. The shed takes it down to 4 leases: one
    # more and it would hold at most half the average count (59 / 9 = 6.6), a joiner the fill on shares fills. Before,
    # the CPU fill then took 2 more off S for the emptiest plain agents, and the fill on shares gave S 4 leases of
    # the plain agents back: 13 moves in one plan for a net 5.
    plan = decide(_fleet([92.0] * 10, [0.77] * 10, spark_leases=11), CONFIG, balance=True)
    assert [move.from_owner for move in plan.moves] == ["S"] * 7


def test_own_base_reads_a_workers_reports_only_where_its_throughput_moved() -> None:
    slope = 5.7
    # A joining worker: five reports with no lease, five with 0.5 KiB/s; its CPU rose by the leases' share only.
    joined = own_base([0.0] * 5 + [0.5] * 5, [13.0] * 5 + [15.85] * 5, slope)
    assert joined == pytest.approx(13.0)
    assert own_base([0.0] * 4, [13.0, 12.0, 14.0, 13.5], slope) == pytest.approx(13.25)  # nothing held: its value
    assert own_base([0.42] * 10, [16.0] * 10, slope) is None  # steady: cannot tell
    assert own_base([0.42] * 9 + [0.0], [16.0] * 10, slope) is None  # one report's figure read 0: no experiment
    assert own_base([0.5, 0.0, 0.5], [15.0, 13.0, 15.0], slope) is None  # too few reports
    # A failed sample (-1) is skipped; leases dearer than the line's slope count as the leases' own rate.
    dear = own_base([0.2] * 5 + [0.4] * 5, [3.0] * 4 + [-1.0] + [7.0] * 5, slope)
    assert dear == pytest.approx(-1.0)
