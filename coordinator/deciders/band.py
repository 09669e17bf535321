"""Strategy `band` (the default): workers outside the band get back into it in one pass with few moves.

Chosen by `lease_assignment_strategy = variance` with `variance_balancing = band` (both defaults). One run:

1. Unassigned and expired leases, then draining workers' leases, go to the worker with most room
   (`FleetPlan.place`, coordinator/deciders/fleet_state.py).
2. On a balancing run, the metric whose workers' confirmed values (projected ones for workers step 1 changed) stray
   furthest outside the band is balanced by one `BandPass` (coordinator/deciders/band_moves.py states its invariants).
3. With every metric inside its band (or none moved by the pass), a joining worker (at most half the average lease
   count, and less than half an average share of the throughput at every report of the persistence window: its CPU
   cannot tell it from the others when the CPU is mostly the agents' own) is filled on throughput into the
   throughput band in the same run, as far as its metric's band allows, that band raised by its own load's excess
   over the fleet's base (`ShareFill`; setting `rebalance_fill_on_throughput`).

Load model: a line `value = base + slope x throughput` per metric fitted over the settled reporting workers
(coordinator/load_model.py), each worker's learned own excess (a Spark driver's JVM) taken out of its values first
(`FleetView`, coordinator/deciders/fleet_state.py); averages count the load of leases that need an owner; an idle
stream balances counts.
"""

from __future__ import annotations

import math

from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.deciders.band_moves import ROUNDING, Band, BandPass
from shardherd.coordinator.deciders.fleet_state import FleetPlan, FleetView
from shardherd.coordinator.ledger import Ledger
from shardherd.coordinator.moves import Plan
from shardherd.coordinator.snapshot import Snapshot
from shardherd.shared.worker import THROUGHPUT_METRIC

NAME = "band"
# A worker is filled on throughput only below this share of an average worker's KiB/s (a joining worker).
SHARE_FILL_BELOW = 50.0


def metric_to_balance(plan: FleetPlan) -> Band | None:
    """The band of the metric whose workers' confirmed values stray furthest outside it; None if none does.

    A worker a move of this run changed (a placed or drained lease) counts at its projected value.
    """
    view = plan.view
    best: tuple[float, Band] | None = None
    for metric, avg in view.averages.items():  # idle stream: only a worker under half the average count is filled
        band = Band.around(metric, avg, view.half_band(metric), view.min_gain(metric),
                           view.config.rebalance_dead_band_percentage, avg / 2 if view.count_only else math.inf)
        stray = 0.0
        for wid in view.active:
            value = (plan.values(wid) if wid in plan.changed else view.confirmed[wid]).get(metric)
            if value is not None:
                stray += max(0.0, value - min(band.upper, view.limits[wid][metric])) + max(0.0, band.lower - value)
        if stray > 0 and (best is None or stray > best[0]):
            best = (stray, band)
    return None if best is None else best[1]


def joiner_ceiling(view: FleetView, wid: str, metric: str, value: float, carried: float) -> float:
    """The ceiling of a joining worker at `value` on `metric` while it carries `carried` KiB/s (see ShareFill).

    The band's edge raised by its own load's excess over the fleet's fitted base, never past its operating range.
    """
    edge = view.ceiling(wid, metric)
    excess = value - view.rise(wid, metric, carried) - view.lines[metric].base
    return max(edge, min(edge + excess, view.limits[wid][metric]))


class ShareFill(BandPass):
    """Fill only, on each worker's share of the average, while its reported metrics stay in band.

    A share is KiB/s, or a lease count where throughput cannot tell an empty worker from the rest (decision 0042):
    there every lease weighs one lease's points and the minimum gain is one lease, so a move leaves the receiver at
    most as many leases as its giver keeps, and no run moves one back.
    """

    def __init__(self, plan: FleetPlan, band: Band, counts_leases: bool, after_shed: bool) -> None:
        view = plan.view
        self.counts_leases = counts_leases
        self._share = view.n_leases / max(1, len(view.active)) if counts_leases else view.target_throughput
        super().__init__(plan, band)
        # After a pass that moved: workers that gave a lease in this run are not filled in it.
        self._gave = {move.from_owner for move in plan.ledger.moves.values()} if after_shed else set()

    def has_metric(self, wid: str) -> bool:
        """Every balanced worker has a share."""
        return True

    def level(self, wid: str) -> float:
        """The worker's share now, in points of an average share."""
        ledger = self.plan.ledger
        return self.rise(wid, ledger.count(wid) if self.counts_leases else ledger.throughput.get(wid, 0.0))

    def confirmed(self, wid: str) -> float:
        """Its share now or at a report of the persistence window, whichever is nearest the average (counts: now)."""
        if self.counts_leases or wid in self.plan.changed:
            return self.level(wid)
        past = [self.rise(wid, kbps) for kbps in self.view.carried_history.get(wid, ())]
        return min((self.level(wid), *past), key=lambda v: (abs(v - 100.0), v))

    def limit(self, wid: str) -> float:
        """The band's edge (a share has no operating range)."""
        return self.band.upper

    def rise(self, wid: str, weight: float) -> float:
        """`weight` (KiB/s or leases) in points of an average share."""
        return 100.0 * weight / self._share

    def fall(self, wid: str, key: str) -> float:
        """The lease's weight in points of an average share."""
        return self.rise(wid, self._weight[key])

    def fillable(self, wid: str) -> bool:
        """Only a joining worker: at most half the average lease count (its metric may say it is busy otherwise)."""
        joining = 2 * self.plan.ledger.count(wid) <= self.view.n_leases / max(1, len(self.view.active))
        return joining and wid not in self._gave

    def room_left(self, wid: str, weight: float) -> bool:
        """Whether every metric the joining worker reports stays under its ceiling with the lease.

        Its own load (its value less what its leases add: a Spark driver's JVM, say) may sit above the fleet's fitted
        base: leases did not put it there, and no placement changes it. Its ceiling is the band's upper edge raised by
        that excess, so it may take the lease load an average worker carries (plus half a band), never past its
        operating range. Without that, such a worker was never filled (issue 33: a new Spark driver held no lease).
        """
        carried = self.plan.ledger.throughput.get(wid, 0.0)
        view = self.view
        return all(value + view.rise(wid, metric, weight)
                   <= joiner_ceiling(view, wid, metric, value, carried) + ROUNDING * max(1.0, value)
                   for metric, value in self.plan.values(wid).items())


def share_fill(plan: FleetPlan, after_shed: bool) -> ShareFill:
    """The fill on throughput shares, or on lease counts where an empty worker is inside the throughput band's floor.

    There the fleet's whole throughput is within the noise margin (decision 0042).
    """
    view, cfg = plan.view, plan.view.config
    floors = (cfg.rebalance_threshold_percentage, cfg.rebalance_min_band_points)
    dead = cfg.rebalance_dead_band_percentage
    gain = view.gain_floor(THROUGHPUT_METRIC)  # the minimum gain: as `FleetView.min_gain`, the average being 100
    band = Band.around(THROUGHPUT_METRIC, 100.0, max(*floors, 2.0 * gain), max(gain, dead), dead, SHARE_FILL_BELOW)
    if band.floor > 0:
        return ShareFill(plan, band, False, after_shed)
    one = 100.0 * len(view.active) / view.n_leases  # one lease, in points of the average count
    band = Band.around(THROUGHPUT_METRIC, 100.0, max(*floors, min(one, 25.0)), one, dead, SHARE_FILL_BELOW)
    return ShareFill(plan, band, True, after_shed)


def fill_on_share(plan: FleetPlan, why: str = "balancing: no metric out of band", after_shed: bool = False) -> str:
    """With no metric out of band (`why`), fill joining workers on shares; the note says what happened.

    `after_shed`: after a pass that moved, only workers that gave no lease in this run.
    """
    view = plan.view
    if not view.config.rebalance_fill_on_throughput or view.count_only or view.target_throughput <= 0 or (
            THROUGHPUT_METRIC in view.averages):
        return why
    fill = share_fill(plan, after_shed)
    fill.fill()  # fill only: nothing is shed on shares
    if not fill.moved:
        return why
    measure = "lease count" if fill.counts_leases else THROUGHPUT_METRIC
    return f"{why}; filling on {measure}: band [{fill.band.lower:.2f}, {fill.band.upper:.2f}]"


def balance_pass(plan: FleetPlan) -> str:
    """One balancing pass on the metric furthest out of band, else the fill on throughput; a note on what it did."""
    if plan.view.falling:
        return "balancing: the fleet's throughput is falling fast; waiting for reports to catch up"
    band = metric_to_balance(plan)
    if band is None:
        return fill_on_share(plan)
    balancing = BandPass(plan, band)
    balancing.run()
    note = f"balancing {band.metric} (band): avg {band.avg:.2f}, band [{band.lower:.2f}, {band.upper:.2f}]"
    # Out of band but nothing (more) to move (a joining worker's own load above the band, say): fill as if in band,
    # after a pass that moved only workers that gave nothing (the next run, on the same reports, would fill those).
    return fill_on_share(plan, note if balancing.moved else f"{note}: nothing to move", bool(balancing.moved))


class BandDecider:
    """The `band` strategy behind the `Decider` protocol."""

    name = NAME

    def plan(self, snapshot: Snapshot, config: DeciderConfig, balance: bool) -> Plan:
        """Placement, drain and (if `balance`) one band pass."""
        ledger = Ledger(snapshot)
        plan = FleetPlan(FleetView(snapshot, config, ledger, band=True), ledger)
        plan.place()
        notes = [balance_pass(plan)] if balance else []
        return plan.result(NAME, balance, notes)

