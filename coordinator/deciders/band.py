"""Strategy `band` (the default): workers outside the band get back into it in one pass with few moves.

One run (`variance_balancing = band`):
1. Unassigned, expired, then draining workers' leases go to the roomiest worker (`FleetPlan.place`, fleet_state.py).
2. On a balancing run, the metric whose workers (confirmed values; projected ones once a move changed them) stray
   furthest outside the band is balanced by one `BandPass` (band_moves.py states its invariants).
3. Then, whatever balancing moved, a joining worker (at most half the average lease count and under half an average
   share now) is filled on throughput shares (`ShareFill`), each of its metrics under its `joiner_ceiling`.
Values: a line `base + slope x KiB/s` per metric fitted over settled workers, own excess taken out (`FleetView`).
"""

from __future__ import annotations

import math

from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.deciders.band_moves import ROUNDING, Band, BandPass, joiner_ceiling, share_band
from shardherd.coordinator.deciders.fleet_state import FleetPlan, FleetView
from shardherd.coordinator.ledger import Ledger
from shardherd.coordinator.moves import Plan
from shardherd.coordinator.snapshot import Snapshot
from shardherd.shared.worker import THROUGHPUT_METRIC

NAME = "band"


def metric_to_balance(plan: FleetPlan) -> Band | None:
    """The band of the metric whose workers stray furthest outside it (None if none does)."""
    view = plan.view
    best, most = None, 0.0  # the band of the metric straying furthest so far, and how far
    for metric, avg in view.averages.items():  # idle stream: only a worker under half the average count is filled
        band = Band.around(metric, avg, view.half_band(metric), view.min_gain(metric),
                           view.config.rebalance_dead_band_percentage, avg / 2 if view.count_only else math.inf)
        counted = ((w, (plan.values(w) if w in plan.changed else view.confirmed[w]).get(metric)) for w in view.active)
        stray = sum(max(0.0, value - min(band.upper, view.limits[w][metric])) + max(0.0, band.lower - value)
                    for w, value in counted if value is not None)
        if stray > most:
            best, most = band, stray
    return best


class ShareFill(BandPass):
    """Fill only, on each worker's share now (KiB/s, or lease counts where KiB/s is noise: 0042; `share_band`).

    A share is not asked to persist (the shed leaves no giver the fill refills); a settling worker gives its fresh
    leases (invariant 1): a joiner into a just-placed fleet is filled at once.
    """

    on_shares = True

    def level(self, wid: str) -> float:
        """The worker's share now, in points of an average share."""
        ledger = self.plan.ledger
        return self.rise(wid, ledger.count(wid) if self.counts_leases else ledger.throughput.get(wid, 0.0))

    def rise(self, wid: str, weight: float) -> float:
        """`weight` (KiB/s or leases) in points of an average share."""
        return 100.0 * weight / (self._per_worker if self.counts_leases else self.view.target_throughput)

    def fall(self, wid: str, key: str) -> float:
        """The lease's weight in points of an average share."""
        return self.rise(wid, self._weight[key])

    def room_left(self, wid: str, weight: float) -> bool:
        """Whether every metric the worker reports stays under its `joiner_ceiling` with the lease."""
        carried = self.plan.ledger.throughput.get(wid, 0.0)
        return all(value + self.view.rise(wid, metric, weight)
                   <= joiner_ceiling(self.view, wid, metric, value, carried) + ROUNDING * max(1.0, value)
                   for metric, value in self.plan.values(wid).items())


def balance_pass(plan: FleetPlan) -> str:
    """One balancing pass on the metric furthest out of band, then the fill on shares; a note on what it did."""
    band, shares = metric_to_balance(plan), share_band(plan.view)
    note = "balancing: no metric out of band"
    if band is not None:
        moved = BandPass(plan, band, shares=shares).run()
        note = f"balancing {band.metric} (band): avg {band.avg:.2f}, band [{band.lower:.2f}, {band.upper:.2f}]" + (
            "" if moved else ": nothing to move")
    if shares is None:
        return note
    fill = ShareFill(plan, *shares)
    fill.fill()  # fill only: nothing is shed on shares
    if not fill.moved:
        return note
    measure = "lease count" if fill.counts_leases else THROUGHPUT_METRIC
    return f"{note}; filling on {measure}: band [{fill.band.lower:.2f}, {fill.band.upper:.2f}]"


class BandDecider:
    """The `band` strategy behind the `Decider` protocol."""

    name = NAME

    def plan(self, snapshot: Snapshot, config: DeciderConfig, balance: bool) -> Plan:
        """Placement, drain and (if `balance`) one band pass."""
        ledger = Ledger(snapshot)
        plan = FleetPlan(FleetView(snapshot, config, ledger), ledger)
        plan.place()
        return plan.result(NAME, balance, [balance_pass(plan)] if balance else [])
