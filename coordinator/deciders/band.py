"""Strategy `band` (the default): workers outside the band get back into it in one run with as few moves as possible.

Chosen by `lease_assignment_strategy = variance` with `variance_balancing = band` (both defaults). Placement, the
catch-up of lagging reports and the projections are shared with strategy `kcl-variance`
(coordinator/deciders/fleet_state.py); the moves (shed, swap, push, fill) are in coordinator/deciders/band_moves.py.

The load model: each metric's line `value = base + slope x throughput` is fitted over the settled reporting workers
(coordinator/load_model.py) to project moves; the averages count the load of leases that still need an owner (they
will add it once placed); with no throughput figure at all (idle stream, new application) every worker is balanced on
its lease count through the throughput-share metric, every lease weighing 1, and that metric has no operating range
(the band alone decides).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Mapping

from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.deciders.band_moves import (
    ALTERNATIVES,
    SAFE,
    USUAL,
    Outcome,
    Style,
    balance_band,
    leases_to_cover,
)
from shardherd.coordinator.deciders.fleet_state import RECEIVER_PROBES, FleetState, HeapEntry
from shardherd.coordinator.load_model import Line, fit_line, proportional
from shardherd.coordinator.moves import Plan
from shardherd.coordinator.snapshot import LeaseView, Snapshot
from shardherd.shared.worker import THROUGHPUT_METRIC

NAME = "band"


class BandFleet(FleetState):
    """The band strategy's load model (fitted lines, unowned load counted) and its balancing phase."""

    strategy = NAME
    share_limit = math.inf  # balanced on the band alone, or every worker above the average share would have to shed

    def __init__(self, snapshot: Snapshot, config: DeciderConfig, style: Style = USUAL) -> None:
        self.style = style
        self.outcome: Outcome | None = None  # what the balancing pass left (None: no metric out of band)
        super().__init__(snapshot, config)

    def _counts_only(self) -> bool:
        """No throughput figure at all: no metric can be tied to a lease, so lease counts are balanced."""
        return self.ledger.unit_weights

    def _fleet_means(self) -> dict[str, float]:
        return self._averages(active_only=True)

    def _balancing_averages(self) -> dict[str, float]:
        """Each metric's average once every lease has an owner, from the non-draining workers' mean.

        The leases that still need an owner (unassigned, expired, on a draining worker) will add their projected
        load to the fleet; KCL instead counts draining workers' whole values (idle part included) and nothing for
        unowned leases, so its band sits too high while draining and too low after a crash.
        """
        # Around each worker's typical value over its last reports (a spike or dip of one worker does not shift the
        # band, nor does the reports' noise); a metric only draining workers have: 0, as in KCL.
        means = self._averages(active_only=True, values=self.centres)
        for metric, mean in means.items():
            if metric == THROUGHPUT_METRIC and self.target_throughput > 0:
                self.lines.setdefault(metric, Line(0.0, 100.0 / self.target_throughput))
            self.lines.setdefault(metric, proportional(mean, self.carried_throughput))
        gone = set(self.draining)
        orphaned = sum(weight for key, weight in self.ledger.weight.items()
                       if self.ledger.leases[key].needs_owner or self.ledger.owner[key] in gone)
        share = orphaned / max(1, len(self.active))
        averages = {}
        for metric, mean in means.items():
            extra = self.lines[metric].slope * share if share > 0 else 0.0
            averages[metric] = mean + extra if math.isfinite(extra) else mean  # degenerate (subnormal) throughput
        return averages

    def _carried_throughput(self) -> float:
        """The KiB/s a worker at the average value carries: what the reporting workers hold on average.

        `T` also counts unowned and expired leases, whose load no reported value shows yet, so after a crash it
        would understate how much each lease adds.
        """
        reporting = {w for w in self.active if w not in self.default}
        ledger, carried = self.ledger, 0.0
        for key, owner in ledger.owner.items():
            if owner in reporting and not ledger.leases[key].needs_owner:
                carried += ledger.weight[key]
        return carried / len(reporting) if reporting and carried > 0 else self.target_throughput

    def _fit(self, lagged: Mapping[str, float]) -> dict[str, Line]:
        """Each metric's line fitted over (lagged throughput, value) of the settled reporting workers.

        An unsettled worker's report and its recorded throughput may come from different moments (a report that
        averages a period before and after a move), so its point would bend the line.
        """
        lines: dict[str, Line] = {}
        for metric, avg in self._averages(active_only=True).items():
            points = [(lagged.get(w, self.ledger.known_throughput(w)), self.values[w][metric]) for w in self.active
                      if w not in self.default and w not in self.unsettled and metric in self.values[w]
                      and metric not in self.saturated.get(w, ())]
            line = fit_line(points, avg)
            if line is not None:
                lines[metric] = line
        return lines

    def _heavy_receiver(self, heap: list[HeapEntry], chosen: HeapEntry, lease: LeaseView) -> HeapEntry:
        """A lease too heavy for the roomiest worker's band goes where it costs fewest sheds after it.

        Of the roomiest workers, the one that must shed fewest of its own lighter leases to take it (a push's choice,
        `leases_to_cover`); the roomiest among equals. After a crash the heaviest orphaned lease (placed first) went
        to the roomiest worker, which then shed three light leases where a worker holding one medium lease sheds that
        one (fleet_sim, crash, full size, seed 8).
        Only a lease with a reported figure, among workers that report a metric.
        """
        weight = self.ledger.weight[lease.key]
        if lease.throughput_kbps is None or self.count_only or self._overshoot(chosen[2], weight) is None:
            return chosen
        candidates = [chosen]
        while heap and len(candidates) < RECEIVER_PROBES:
            candidates.append(heapq.heappop(heap))
        lowest: dict[str, float] = {}  # per metric, the least loaded active worker's value (found once per lease)
        best = min(candidates, key=lambda entry: (self._sheds_after(entry[2], weight, lowest), entry))
        for entry in candidates:
            if entry is not best:
                heapq.heappush(heap, entry)
        return best

    def _overshoot(self, wid: str, weight: float) -> tuple[str, float] | None:
        """The metric a lease of `weight` KiB/s would put the worker furthest above its ceiling, and by how much.

        None if it stays under every ceiling (or the worker reports no metric).
        """
        if wid in self.default:
            return None
        worst: tuple[str, float] | None = None
        for metric, value in self.values[wid].items():
            over = value + self.rise(wid, metric, weight) - self.band_ceiling(wid, metric)
            if over > 0 and (worst is None or over > worst[1]):
                worst = (metric, over)
        return worst

    def _sheds_after(self, wid: str, weight: float, lowest: dict[str, float]) -> float:
        """How many of its leases lighter than `weight` the worker must shed to take such a lease inside the band.

        Infinite where they are not enough or the worker reports no metric. `lowest` memoises, per metric, the
        least loaded active worker's value across the candidates for one lease.
        """
        overshoot = self._overshoot(wid, weight)
        if overshoot is None:
            return math.inf if wid in self.default else 0.0
        metric, over = overshoot
        rate = self.drop_rate(wid, metric)
        # Only leases some other worker has room for count: the least loaded takes at most up to the band's edge.
        if metric not in lowest:
            lowest[metric] = min(vals[metric] for w, vals in self.values.items() if w in self.active and metric in vals)
        edge = self.averages[metric] + self.half_band(metric)
        room = (edge - lowest[metric]) / max(self.rise(wid, metric, 1.0), 1e-12)
        lighter = [self.ledger.weight[key] for key in self.ledger.held_by.get(wid, {})
                   if self.ledger.weight[key] < weight and self.ledger.weight[key] <= room]
        if rate is None or rate * sum(lighter) < over:
            return math.inf
        return leases_to_cover([rate * kbps for kbps in lighter], over)

    def _balance(self, notes: list[str]) -> None:
        self.outcome = balance_band(self, notes, self.style)


class BandDecider:
    """The `band` strategy behind the `Decider` protocol."""

    name = NAME

    def plan(self, snapshot: Snapshot, config: DeciderConfig, balance: bool) -> Plan:
        """Priority assignment, drain, and (if `balance`) band balancing with the fewest moves of the styles tried.

        The usual style is planned first. Only if some donor in it gave more than one lease is each alternative
        (`ALTERNATIVES`: deep sheds, trades first) planned from the same snapshot; one replaces the plan only if it
        makes fewer moves, leaves no more workers outside the band and none nearer its ceiling (decision 0016).
        If the plan kept lands moved workers near their ceiling, the `SAFE` style (a noise margin under every
        ceiling) replaces it where its extra moves are at most the number of those workers expected to shed again
        (decision 0017).
        """
        fleet = BandFleet(snapshot, config)
        plan = fleet.plan(balance)
        if not balance or fleet.outcome is None:
            return plan
        usual, outcome = len(plan.moves), fleet.outcome
        for style in ALTERNATIVES if outcome.repeated else ():
            other = BandFleet(snapshot, config, style)
            alternative = other.plan(balance)
            if (other.outcome is None or not other.outcome.no_worse(outcome)
                    or len(alternative.moves) >= len(plan.moves)):
                continue
            plan = dataclasses.replace(alternative, notes=(
                *alternative.notes, f"balancing: {style.name} saves {usual - len(alternative.moves)} move(s)"))
            outcome = other.outcome
        if outcome.risk:
            other = BandFleet(snapshot, config, SAFE)
            alternative = other.plan(balance)
            if other.outcome is not None and other.outcome.safer(outcome, len(alternative.moves), len(plan.moves)):
                extra = len(alternative.moves) - len(plan.moves)
                cost = f"for {extra} more move(s)" if extra > 0 else f"saving {-extra} move(s)"
                plan = dataclasses.replace(alternative, notes=(
                    *alternative.notes, f"balancing: {SAFE.name} {cost}, where {outcome.risk:.2f} moved worker(s) "
                                        f"would be expected to shed again"))
        return plan
