"""Strategy `kcl-variance`: KCL 3.x's variance decider (dampened donor budgets), with its weak spots fixed.

Chosen by `lease_assignment_strategy = variance` with `variance_balancing = kcl`. It reproduces the worked examples of
KCL's `VarianceBasedLeaseAssignmentDecider` tests (tests/coordinator/test_variance.py). Placement, the catch-up of
lagging reports and the projections are shared with strategy `band` (coordinator/deciders/fleet_state.py: `FleetView`,
`FleetPlan`); KCL's model (`KclView`) replaces band's: proportional lines, no own excess, draining workers' values in
the averages.

Kept from KCL: balancing on the metric with the largest dampened budget, donors above the band or their operating
range, the strict `remaining - x > 0` walk, overshoot with the smallest lease, receivers never pushed past the fleet
average or their operating range; the synthetic throughput metric's operating range is 100 (the average share) and
a lease weighs `100 * x / T` points of it, `T` being the fleet's throughput over the non-draining workers.

Differences:
* A receiver that would pass the average is put back and smaller leases (and further receivers) are tried; KCL ends
  the donor and drops the receiver for the rest of the run.
* A balancing move whose effect on the donor/receiver gap is below `rebalance_dead_band_percentage` of the average is
  not made (KCL issue #1814).
* Donor leases are walked largest first instead of in random order: deterministic, and the budget moves fewer leases.
* A donor above its operating range but below the average uses the operating range as its target, so its budget is
  positive; the fallback donor (trigger only from below) gives nothing if it is not above the average.
* A donor at value 0 has no budget instead of dividing by zero.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.deciders.fleet_state import PROBES, FleetPlan, FleetView, HeapEntry, Kbps, Values
from shardherd.coordinator.ledger import Ledger
from shardherd.coordinator.load_model import proportional
from shardherd.coordinator.moves import MoveReason, Plan
from shardherd.coordinator.snapshot import Snapshot, WorkerView
from shardherd.shared.streams import stream_prefix
from shardherd.shared.worker import THROUGHPUT_METRIC

NAME = "kcl-variance"


class KclView(FleetView):
    """The fleet as KCL models it: proportional lines, no own excess, a default worker's operating range 100 (`T`)."""

    counts_idle = False  # an idle stream weighs every lease 1, yet reported metrics stay

    def _model(self, snapshot: Snapshot, values: Values, seen: Kbps, now: Kbps,
               reporting: Sequence[WorkerView]) -> None:
        """Each metric's line through 0 and the mean value at the average share `T`; values caught up."""
        self.fitted = {}
        self.lines = {m: proportional(mean, self.target_throughput) for m, mean in self._mean(values, values).items()}
        self.values = self._catch_up(values, seen, now)
        self.learned, self.own = {}, {}
        self.limits.update({w: {THROUGHPUT_METRIC: 100.0} for w in self.default})

    def _averages(self, values: Values) -> dict[str, float]:
        """Each metric's mean over the non-draining workers, draining workers' values summed in (as KCL)."""
        return self._mean(values, values)


class KclBalancer:
    """KCL's donor budgets over a plan (`FleetPlan`, coordinator/deciders/fleet_state.py)."""

    def __init__(self, plan: FleetPlan) -> None:
        self.plan = plan
        self.view = plan.view
        self.ledger = plan.ledger

    def _donors(self) -> tuple[str, dict[str, float], str] | None:
        """The metric to balance (largest total budget), its donors' throughput budgets and a note; None if none."""
        best: tuple[str, dict[str, float], str] | None = None
        best_total = 0.0
        for metric, avg in self.view.averages.items():
            budgets = self._budgets(metric, avg)
            total = sum(budgets.values())
            if budgets and (total > best_total or best is None):
                half = self.view.half_band(metric)
                note = (f"balancing {metric}: avg {avg:.2f}, band [{avg - half:.2f}, {avg + half:.2f}], "
                        f"{len(budgets)} donor(s)")
                best, best_total = (metric, budgets, note), total
        return best

    def _budgets(self, metric: str, avg: float) -> dict[str, float]:
        """Each donor's dampened budget on `metric` (KiB/s); empty if no worker is out of band or range.

        Donors: workers at or above the band or over their range, else the most loaded; the values are the confirmed
        ones (what persisted, `FleetView._confirm`).
        """
        view = self.view
        holders = [wid for wid in view.active if metric in view.values[wid]]
        half = view.half_band(metric)
        vals = {wid: view.confirmed[wid][metric] for wid in holders}
        lim = {wid: view.limits[wid][metric] for wid in holders}
        if not any(abs(v - avg) > half or v > lim[w] for w, v in vals.items()):
            return {}
        donors = [w for w, v in vals.items() if v >= avg + half or v > lim[w]] or [
            min(holders, key=lambda w: (-vals[w], w))]
        damp = view.config.dampening_percentage / 100.0
        budgets = {wid: self.ledger.throughput.get(wid, 0.0) * _excess(vals[wid], avg, lim[wid]) * damp
                   for wid in donors}
        return {wid: budget for wid, budget in budgets.items() if _excess(vals[wid], avg, lim[wid]) > 0}

    def _pick(self, donor: str, budget: float) -> list[str]:
        """The donor's leases to give away: largest first while `remaining - x > 0`, else the smallest (overshoot)."""
        ledger = self.ledger
        keys = ledger.movable(donor)
        if not keys or donor in self.view.stale:
            return []
        # Between leases of equal weight, first those of the stream the donor holds most leases of (multi-stream
        # applications: a stream is not left piled on one worker); single-stream keys all tie on this.
        per_stream = self.plan.stream_counts(donor)
        if ledger.throughput.get(donor, 0.0) <= 0:
            return [min(keys, key=lambda k: (-per_stream[stream_prefix(k)], k))]
        keys.sort(key=lambda k: (-ledger.weight[k], -per_stream[stream_prefix(k)], k))
        chosen: list[str] = []
        remaining = budget
        for key in keys:
            weight = ledger.weight[key]
            if remaining - weight > 0:
                chosen.append(key)
                remaining -= weight
        if not chosen and self.view.config.allow_throughput_overshoot:
            chosen.append(keys[-1])
        return chosen

    def _fits(self, wid: str, projected: Mapping[str, float], donor: str, metric: str, key: str) -> bool:
        """Whether a receiver may take the lease: within its range and at most the average (KCL's rule).

        With `allow_receiver_above_average`, a receiver that stays inside the band and not above the donor after the
        move is accepted too: with few, uneven leases per worker no lease fits under the average, and a donor above
        the band would otherwise stay there.
        """
        view = self.view
        limits = view.limits[wid]
        if any(v > limits[m] for m, v in projected.items()):
            return False
        if all(v <= view.averages[m] for m, v in projected.items()):
            return True
        if not view.config.allow_receiver_above_average:
            return False
        donor_after = self.plan.values(donor)[metric] - self.plan.drop(donor, metric, key)
        inside = all(v < view.averages[m] + view.half_band(m) for m, v in projected.items())
        return inside and metric in projected and projected[metric] <= donor_after

    def _give(self, heap: list[HeapEntry], key: str, donor: str, metric: str, budget: float) -> None:
        """Move one donor lease to the first of a few most-room receivers that stays within average and range."""
        weight, view, plan = self.ledger.weight[key], self.view, self.plan
        avg = view.averages
        drop_pct = 100.0 * plan.drop(donor, metric, key) / avg[metric] if avg[metric] else 0.0
        set_aside: list[HeapEntry] = []
        for _ in range(PROBES):
            if not heap:
                break
            entry = heapq.heappop(heap)
            wid = entry[2]
            set_aside.append(entry)
            if wid == donor or self.ledger.leases[key].avoids(wid):  # never back to a worker that gave it back
                continue
            projected = {m: v + view.rise(wid, m, weight) for m, v in plan.values(wid).items()}
            if not self._fits(wid, projected, donor, metric, key):
                continue
            rise_pct = max((100.0 * (projected[m] - plan.values(wid)[m]) / avg[m] if avg[m] else 0.0)
                           for m in projected)
            if drop_pct + rise_pct < view.config.rebalance_dead_band_percentage:
                break
            set_aside.pop()
            before = plan.values(donor)[metric]
            detail = (
                f"donor {metric}={before:.2f} avg {avg[metric]:.2f} budget {budget:.1f} KiB/s; "
                f"lease {weight:.1f} KiB/s; receiver room {-entry[0]:.3g}"
            )
            plan.move(key, wid, MoveReason.for_metric(metric), detail)
            plan.requeue(heap, wid)
            break
        for entry in set_aside:
            heapq.heappush(heap, entry)

    def run(self) -> str:
        """Each donor, largest budget first, gives its picked leases to the roomiest workers; a note on it."""
        chosen = self._donors()
        if chosen is None:
            return "balancing: no metric out of band"
        metric, budgets, note = chosen
        heap = self.plan.queue()
        for donor in sorted(budgets, key=lambda w: (-budgets[w], w)):
            for key in self._pick(donor, budgets[donor]):
                self._give(heap, key, donor, metric, budgets[donor])
        return note

def _excess(value: float, avg: float, limit: float) -> float:
    """The share of its load a donor is above its target: the average, or its range where it is over that."""
    target = min(avg, limit) if value > limit else avg
    return (value - target) / value if value > 0 and value > target else 0.0


class KclVarianceDecider:
    """The `kcl-variance` strategy behind the `Decider` protocol."""

    name = NAME

    def plan(self, snapshot: Snapshot, config: DeciderConfig, balance: bool) -> Plan:
        """Priority assignment, drain, and (if `balance`) KCL's dampened-budget balancing."""
        ledger = Ledger(snapshot)
        plan = FleetPlan(KclView(snapshot, config, ledger), ledger)
        plan.place()
        notes = [KclBalancer(plan).run()] if balance else []
        return plan.result(NAME, balance, notes)
