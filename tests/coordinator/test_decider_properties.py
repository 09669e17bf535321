"""Properties of every strategy over random fleets (hypothesis): a plan never raises, the band's invariants
(coordinator/deciders/band_moves.py) hold after every move, and a band plan applied and planned again on the reports
it projects moves nothing. (kcl-variance's dampened budgets converge over several runs by design; lease-count does
not move leases it placed or drained in the same run, so after a drain onto a full worker its next run moves one:
hypothesis found it, and test_decide.py checks its one-run convergence without drains.)

The fleets for the last property follow the load model exactly (CPU = k x carried KiB/s, or no metric at all), so the
next run's reports are what the plan projected.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardherd.coordinator.decide import decide
from shardherd.coordinator.decider_config import DeciderConfig, Strategy
from shardherd.coordinator.deciders.band import balance_pass
from shardherd.coordinator.deciders.band_moves import joiner_ceiling
from shardherd.coordinator.deciders.fleet_state import FleetPlan, FleetView
from shardherd.coordinator.ledger import Ledger
from shardherd.coordinator.load_model import Line
from shardherd.coordinator.moves import MoveReason, Plan
from shardherd.coordinator.snapshot import LeaseView, Snapshot, WorkerView
from shardherd.shared.worker import THROUGHPUT_METRIC

EPS = 1e-6


@st.composite
def fleets(draw: st.DrawFn, exact: bool = False) -> Snapshot:
    """A random fleet; with `exact`, every worker's CPU is k x what it carries (or it reports no metric)."""
    n_workers = draw(st.integers(1, 7))
    wids = [f"w{i}" for i in range(n_workers)]
    k = draw(st.sampled_from([0.01, 0.1, 0.5]))
    default = exact and draw(st.booleans())
    streams = draw(st.sampled_from([(), ("a",), ("a", "b", "c")]))  # () : single-stream keys
    leases = []
    for i in range(draw(st.integers(0, 24))):
        owner = draw(st.sampled_from([*wids, None]))
        kbps = draw(st.one_of(st.floats(0, 1000), st.sampled_from([0.0, 1.0, 1024.0])))
        key = f"123456789012:{draw(st.sampled_from(streams))}:1700000000:shardId-{i:012d}" if streams else f"l{i:02d}"
        leases.append(LeaseView(
            key, owner, throughput_kbps=None if not exact and draw(st.integers(0, 8)) == 0 else kbps,
            expired=not exact and owner is not None and draw(st.integers(0, 5)) == 0,
            recently_moved=draw(st.integers(0, 6)) == 0, settling=draw(st.integers(0, 8)) == 0,
            fresh=draw(st.integers(0, 8)) == 0,
            refused_by=frozenset(draw(st.lists(st.sampled_from(wids), max_size=1)))))
    carried = {w: sum(lease.throughput_kbps or 0.0 for lease in leases if lease.lease_owner == w) for w in wids}
    workers = []
    for wid in wids:
        draining = draw(st.integers(0, 6)) == 0
        stale = draw(st.integers(0, 6)) == 0
        if default:
            workers.append(WorkerView(wid, draining=draining, stale=stale))
            continue
        limit = draw(st.sampled_from([60.0, 100.0, 1000.0]))
        value = k * carried[wid] if exact else draw(st.floats(0, 100))
        workers.append(WorkerView(wid, {"C": (value, value)}, {"C": (limit,)}, draining=draining, stale=stale))
    return Snapshot.of(leases, workers)


CONFIGS = st.builds(DeciderConfig, strategy=st.sampled_from(list(Strategy)),
                    max_leases_for_worker=st.sampled_from([2, 2**31 - 1]),
                    rebalance_dead_band_percentage=st.sampled_from([0.0, 2.0]))


@settings(max_examples=100, deadline=None)
@given(snapshot=fleets(), config=CONFIGS, balance=st.booleans())
def test_no_strategy_raises_and_each_lease_moves_at_most_once(snapshot: Snapshot, config: DeciderConfig,
                                                            balance: bool) -> None:
    plan = decide(snapshot, config, balance)
    keys = [move.lease_key for move in plan.moves]
    assert len(keys) == len(set(keys))
    leases = {lease.key: lease for lease in snapshot.leases}
    for move in plan.moves:
        assert not leases[move.lease_key].pinned
        if move.reason.is_balancing:
            assert not leases[move.lease_key].recently_moved


class CheckedPlan(FleetPlan):
    """A plan that checks the band's invariants 1-4 (3, 4: no giver the fill on shares refills) at every move."""

    def __init__(self, view: FleetView, ledger: Ledger) -> None:
        super().__init__(view, ledger)
        self.gave_under_range: set[str] = set()  # givers balancing moved a lease off under their operating range

    def move(self, key: str, wid: str, reason: MoveReason, detail: str) -> None:
        """Check, then move."""
        view, ledger = self.view, self.ledger
        giver = ledger.owner[key]
        if reason.is_balancing:
            lease = ledger.leases[key]
            assert self.assignable(wid) and not lease.avoids(wid) and not lease.pinned and not lease.recently_moved
            assert giver not in view.stale and (giver not in view.settling or key in view.fresh)
            before = {w: dict(self.values(w)) for w in (giver, wid) if w is not None and w in view.values}
            carried = ledger.throughput.get(wid, 0.0)
        super().move(key, wid, reason, detail)
        if not reason.is_balancing or giver is None:
            return
        # The fill on throughput (no T band) lets a joining worker's ceiling rise by its own load's excess.
        share_fill = reason is MoveReason.BALANCE_THROUGHPUT and THROUGHPUT_METRIC not in view.averages
        # Invariants 3 and 4: a shed or fill under the giver's operating range gives no lease the fill on shares gives
        # back (in the same plan).
        assert not share_fill or wid not in self.gave_under_range, (wid, key)
        if not share_fill and all(v <= view.limits[giver][m] for m, v in before.get(giver, {}).items()):
            self.gave_under_range.add(giver)
        for metric, value in self.values(wid).items():
            ceiling = view.ceiling(wid, metric)
            if share_fill and metric in before.get(wid, {}):
                ceiling = joiner_ceiling(view, wid, metric, before[wid][metric], carried)
            if reason is MoveReason.for_metric(metric) and self._split(key, giver, metric):
                ceiling = min(view.limits[wid][metric], before[giver][metric] - view.min_gain(metric))
            assert value <= ceiling + EPS * max(1.0, value), (metric, value)
            if metric in before.get(giver, {}) and reason is MoveReason.for_metric(metric):
                assert value <= before[giver][metric] - view.min_gain(metric) + EPS * max(1.0, value)
                assert self.values(giver)[metric] < before[giver][metric]

    def _split(self, key: str, giver: str, metric: str) -> bool:
        """Whether `key` and another lease the giver held were each too heavy for a worker inside the band."""
        width, held = 2 * self.view.half_band(metric), (key, *self.ledger.held_by.get(giver, ()))
        heavy = [k for k in held if self.view.rise(giver, metric, self.ledger.weight[k]) > width]
        return len(heavy) >= 2 and heavy[0] == key


@settings(max_examples=100, deadline=None)
@given(snapshot=fleets(), exact=fleets(exact=True), persistent=st.sampled_from([1, 3]))
def test_band_invariants_hold_after_every_move(snapshot: Snapshot, exact: Snapshot, persistent: int) -> None:
    config = DeciderConfig(rebalance_persistent_reports=persistent)
    for fleet in (snapshot, exact):
        ledger = Ledger(fleet)
        plan = CheckedPlan(FleetView(fleet, config, ledger), ledger)
        plan.place()
        balance_pass(plan)


def _spark_like_fleet(seed: int) -> tuple[Snapshot, DeciderConfig]:
    """Plain agents on the fleet's line beside one Spark-like worker `S` whose JVM adds CPU no lease explains, partly
    kept by the leader (`Snapshot.own_excess`), in one, two or three streams: the fleets where band's shed and fill
    gave a lease the fill on shares gave back in the same plan (decisions 0044 and 0046, session 32)."""
    rng = random.Random(seed)
    n_plain, per, streams = rng.randint(2, 9), rng.randint(2, 8), rng.choice([0, 2, 3])
    kbps = rng.choice([0.07, 1.0, 50.0])  # (0.07: every lease within the minimum gain, the fill counts leases)
    line = Line(rng.uniform(0.5, 5.0), rng.uniform(0.01, 6.0) / kbps)

    def key(wid: str, n: int) -> str:
        return f"123456789012:s{n % streams}:1700000000:{wid}-{n}" if streams else f"{wid}-{n}"

    plain, spark_leases = [f"p{i}" for i in range(n_plain)], rng.randint(1, 2 * per)
    leases = [LeaseView(key(w, n), w, throughput_kbps=kbps) for w in plain for n in range(per)]
    leases += [LeaseView(key("S", n), "S", throughput_kbps=kbps) for n in range(spark_leases)]
    plain_cpu = line.base + line.slope * kbps * per
    workers = [WorkerView(w, {"C": (plain_cpu,) * 10}, {"C": (100.0,)}, throughput_history=(kbps * per,) * 10)
               for w in plain]
    cpu = rng.uniform(plain_cpu, 95.0)
    workers.append(WorkerView("S", {"C": (cpu,) * 10}, {"C": (rng.choice([100.0, 60.0]),)},
                              throughput_history=(kbps * spark_leases,) * 10))
    snapshot = Snapshot.of(leases, workers, {"C": line}, {"S": {"C": rng.uniform(0.0, cpu - plain_cpu)}})
    return snapshot, DeciderConfig(rebalance_persistent_reports=rng.choice([1, 3, 8]))


def test_band_invariants_hold_in_seeded_spark_like_fleets() -> None:
    """The invariants over 1,000 seeded Spark-like fleets. Hypothesis's fleets (above) reach the clause "no giver the
    fill on shares refills" only rarely (the fill's case at about 5,000 examples, the multi-stream shed's never). The
    code before the two fixes broke it in 39 of these fleets, and in 19 with the first (f1e230f) but not the second
    (ba8de2f).
    """
    for seed in range(1000):
        snapshot, config = _spark_like_fleet(seed)
        ledger = Ledger(snapshot)
        plan = CheckedPlan(FleetView(snapshot, config, ledger), ledger)
        plan.place()
        balance_pass(plan)  # (CheckedPlan asserts at every move)


def replanned(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """The next run once the plan is written and every worker reported what its load model says for its leases.

    A lease balancing moved in the last few runs stays recently moved when it is placed (the leader counts balancing
    moves only, coordinator/leader_loop.py).
    """
    to = {move.lease_key: move for move in plan.moves}
    leases = [dataclasses.replace(lease, lease_owner=to[lease.key].to_worker, checkpoint_owner=None, expired=False,
                                  handoff_blocked=False,
                                  recently_moved=lease.recently_moved or to[lease.key].reason.is_balancing)
              if lease.key in to else lease for lease in snapshot.leases]
    carried = {w.worker_id: sum(lease.throughput_kbps or 0.0 for lease in leases if lease.lease_owner == w.worker_id)
               for w in snapshot.workers}
    held = {w.worker_id: sum(lease.throughput_kbps or 0.0 for lease in snapshot.leases
                             if lease.lease_owner == w.worker_id) for w in snapshot.workers}
    k = max((w.metric_stats["C"][-1] / held[w.worker_id] for w in snapshot.workers
             if not w.uses_default_metric and held[w.worker_id] > 0), default=0.0)
    workers = [worker if worker.uses_default_metric else dataclasses.replace(
        worker, metric_stats={"C": (k * carried[worker.worker_id],) * 2}) for worker in snapshot.workers]
    return Snapshot.of(leases, workers)


@settings(max_examples=150, deadline=None, derandomize=True)  # (the seeded sweep below adds breadth)
@given(snapshot=fleets(exact=True))
def test_a_band_plan_applied_and_planned_again_moves_nothing(snapshot: Snapshot) -> None:
    config = DeciderConfig()
    plan = decide(snapshot, config, balance=True)
    again = decide(replanned(snapshot, plan), config, balance=True)
    assert again.moves == (), (plan.moves, again.moves)


def _seeded_fleet(seed: int, multi_stream: bool) -> Snapshot:
    """A random fleet as `fleets(exact=True)` draws one, from `random.Random(seed)` (no shrinking, no search)."""
    rng = random.Random(seed)
    wids = [f"w{i}" for i in range(rng.randint(1, 7))]
    streams = rng.choice([("a",), ("a", "b", "c")])
    k = rng.choice([0.01, 0.1, 0.5])
    leases = [LeaseView(f"123456789012:{rng.choice(streams)}:1700000000:shardId-{i:012d}" if multi_stream
                        else f"l{i:02d}", rng.choice([*wids, None]),
                        throughput_kbps=rng.choice([0.0, 1.0, 1024.0, rng.uniform(0, 1000)]),
                        recently_moved=rng.random() < 0.15, settling=rng.random() < 0.1)
              for i in range(rng.randint(0, 24))]
    carried = {w: sum(lease.throughput_kbps or 0.0 for lease in leases if lease.lease_owner == w) for w in wids}
    return Snapshot.of(leases, [WorkerView(w, {"C": (k * carried[w],) * 2}, {"C": (rng.choice([60.0, 100.0, 1000.0]),)},
                                           draining=rng.random() < 0.15, stale=rng.random() < 0.15) for w in wids])


@pytest.mark.parametrize("multi_stream", [False, True], ids=["single-stream", "multi-stream"])
def test_band_plans_of_a_thousand_seeded_fleets_planned_again_move_nothing(multi_stream: bool) -> None:
    """The property above over fixed seeds: hypothesis found its rare counterexamples in some runs only (the deciders
    are deterministic, whatever the hash seed).

    Four causes are fixed: the proportional line took its mean over the non-draining workers and their KiB/s over the
    draining ones too, and a pass that moved left the fill on shares to the next run (decision 0042); a fill stopped
    at the first joiner it could lift no further, and lifted a worker by less than the minimum gain (the two tests
    below). 80,000 seeded fleets, 40,000 of each kind, re-plan without a move.
    """
    config = DeciderConfig()
    for seed in range(1000):
        snapshot = _seeded_fleet(seed, multi_stream)
        plan = decide(snapshot, config, balance=True)
        again = decide(replanned(snapshot, plan), config, balance=True).moves
        assert again == (), (seed, again)


def test_a_fill_goes_on_to_the_next_joiner_when_the_first_takes_nothing_more() -> None:
    """Seed 8,245 of the multi-stream sweep: w1, w2 and w3 are empty; w0 holds 1,024, 187.81 and 117.24 KiB/s.

    The fill on shares lifts w1 with the 187.81 lease (to 70.55 points of an average share), and then nothing fits
    w1 inside the band. The fill stopped there, as if nothing could fit the fuller workers either, and the next run
    gave the 117.24 lease to w2, still empty. Now the same run does.
    """
    key = "123456789012:a:1700000000:shardId-{:012d}".format
    leases = [LeaseView(key(0), "w0", throughput_kbps=1024.0), LeaseView(key(1), "w0", throughput_kbps=187.81),
              LeaseView(key(2), "w0", throughput_kbps=117.24), LeaseView(key(3), "w4", throughput_kbps=1.0),
              LeaseView(key(4), "w4", throughput_kbps=1.0)]
    cpu = {"w0": 13.2905, "w4": 0.02}  # 0.01 x KiB/s
    snapshot = Snapshot.of(leases, [WorkerView(w, {"C": (cpu.get(w, 0.0),) * 2}, {"C": (100.0,)})
                                    for w in ("w0", "w1", "w2", "w3", "w4")])
    plan = decide(snapshot, DeciderConfig(), balance=True)
    assert {(move.lease_key, move.to_worker) for move in plan.moves} == {(key(1), "w1"), (key(2), "w2")}
    assert decide(replanned(snapshot, plan), DeciderConfig(), balance=True).moves == ()


def test_a_fill_does_not_lift_a_worker_by_less_than_the_minimum_gain() -> None:
    """Seed 3,028 of the single-stream sweep: w0 sheds its 1,024 KiB/s lease on CPU and keeps 402.6 KiB/s.

    The run that sheds does not fill w0 on shares (it gave a lease); the next run did, with five leases of 1 KiB/s
    that lifted it from 43.69 to 44.24 points of an average share: moves no report can tell from noise. A lift that
    leaves a worker below the band must raise it by the minimum gain (the dead-band share of an average share).
    """
    held = {"w0": [1024.0, 402.6], "w1": [1024.0, 1.0], "w2": [], "w3": [1024.0, 1.0, 1.0, 1.0],
            "w4": [1024.0, 1.0], "w5": [1024.0]}
    leases = [LeaseView(f"{w}-{i}", w, throughput_kbps=kbps, recently_moved=(w, i) in {("w0", 1), ("w4", 1)})
              for w, weights in held.items() for i, kbps in enumerate(weights)]
    limits = {"w0": 60.0, "w1": 1000.0, "w5": 60.0}
    snapshot = Snapshot.of([*leases, LeaseView("new", None, throughput_kbps=1.0)],
                           [WorkerView(w, {"C": (0.01 * sum(weights),) * 2}, {"C": (limits.get(w, 100.0),)},
                                       stale=w == "w5") for w, weights in held.items()])
    plan = decide(snapshot, DeciderConfig(), balance=True)
    assert [(move.lease_key, move.to_worker) for move in plan.moves if move.reason.is_balancing] == [("w0-0", "w2")]
    assert decide(replanned(snapshot, plan), DeciderConfig(), balance=True).moves == ()


def test_the_proportional_line_counts_draining_workers_on_both_sides() -> None:
    """Seed 217 of the sweep: w0 drains 3,072 KiB/s at CPU 30.72 onto w1 (1,024 at 10.24) and w2 (481 at 4.81).

    Every worker's CPU is 0.01 x its KiB/s, so the line is 0.01 per KiB/s; taking the mean CPU over w1 and w2 against
    the KiB/s all three carry gave 0.0049, the drain landed w2 at a projected 16.7 (really 28.9, above the band), and
    the next run shed from it. Now the draining run sheds what it must, and the next one moves nothing.
    """
    leases = [LeaseView("l0", "w0", throughput_kbps=1024.0), LeaseView("l1", "w1", throughput_kbps=1024.0),
              LeaseView("l2", "w0", throughput_kbps=1024.0), LeaseView("l3", "w2", throughput_kbps=479.99),
              LeaseView("l4", "w2", throughput_kbps=0.0), LeaseView("l5", "w2", throughput_kbps=1.0),
              LeaseView("l6", None, throughput_kbps=361.46), LeaseView("l7", "w0", throughput_kbps=1024.0)]
    workers = [WorkerView("w0", {"C": (30.72,) * 2}, {"C": (60.0,)}, draining=True),
               WorkerView("w1", {"C": (10.24,) * 2}, {"C": (100.0,)}),
               WorkerView("w2", {"C": (4.8099,) * 2}, {"C": (60.0,)})]
    snapshot = Snapshot.of(leases, workers)
    plan = decide(snapshot, DeciderConfig(), balance=True)
    assert {move.reason for move in plan.moves} >= {MoveReason.DRAIN, MoveReason.BALANCE_CPU}
    assert decide(replanned(snapshot, plan), DeciderConfig(), balance=True).moves == ()


def test_a_drain_that_lands_its_receiver_just_above_the_band_is_corrected_in_the_same_run() -> None:
    """Hypothesis found it: the drained lease's receiver lands 0.03 points (here KiB/s) above the throughput band.

    Its reports cannot show that yet, so the run that drains must count the receiver at its projection and shed from
    it (the next run, on reports that show it, would): the plan re-planned on its projected reports moves nothing.
    """
    leases = [LeaseView("a0", "w0", throughput_kbps=50.0), LeaseView("a1", "w0", throughput_kbps=45.0),
              LeaseView("b0", "w1", throughput_kbps=50.0), LeaseView("b1", "w1", throughput_kbps=44.97),
              LeaseView("c0", "w2", throughput_kbps=50.0), LeaseView("c1", "w2", throughput_kbps=39.53),
              LeaseView("c2", "w2", throughput_kbps=0.5), LeaseView("d0", "w3", throughput_kbps=20.0)]
    snapshot = Snapshot.of(leases, [WorkerView("w0"), WorkerView("w1"), WorkerView("w2"),
                                    WorkerView("w3", draining=True)])
    plan = decide(snapshot, DeciderConfig(), balance=True)
    moved = {move.lease_key: (move.to_worker, move.reason) for move in plan.moves}
    assert moved["d0"] == ("w2", MoveReason.DRAIN)  # the roomiest worker: 90.03 -> 110.03, the band is [90, 110]
    assert moved["c2"] == ("w1", MoveReason.BALANCE_THROUGHPUT)  # its smallest lease lands it inside
    assert decide(replanned(snapshot, plan), DeciderConfig(), balance=True).moves == ()
