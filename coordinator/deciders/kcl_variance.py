"""Strategy `kcl-variance`: KCL 3.x's variance decider (dampened donor budgets), with its weak spots fixed.

Chosen by `lease_assignment_strategy = variance` with `variance_balancing = kcl`. It reproduces the worked examples of
KCL's `VarianceBasedLeaseAssignmentDecider` tests (tests/coordinator/test_variance.py). Placement, the catch-up of
lagging reports and the projections are shared with strategy `band` (coordinator/deciders/fleet_state.py).

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
from collections.abc import Mapping

from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.deciders.fleet_state import RECEIVER_PROBES, FleetState, HeapEntry
from shardherd.coordinator.load_model import Line, proportional
from shardherd.coordinator.moves import MoveReason, Plan
from shardherd.coordinator.snapshot import Snapshot
from shardherd.shared.streams import stream_prefix

NAME = "kcl-variance"


class KclVarianceFleet(FleetState):
    """KCL's load model (every metric proportional to carried throughput, `T` as the run) and donor budgets."""

    strategy = NAME
    share_limit = 100.0

    def _counts_only(self) -> bool:
        return False

    def _carried_throughput(self) -> float:
        """KCL's `T`: the fleet's throughput over the non-draining workers (unowned and expired leases included)."""
        return self.target_throughput

    def _fit(self, lagged: Mapping[str, float]) -> dict[str, Line]:
        return {}

    def _fleet_means(self) -> dict[str, float]:
        return self._averages()

    def _balancing_averages(self) -> dict[str, float]:
        """KCL's fleet averages (draining workers' values included), each metric proportional to throughput."""
        averages = self._averages(values=self.centres)
        self.lines = {m: proportional(avg, self.carried_throughput) for m, avg in averages.items()}
        return averages

    def _donors(self) -> tuple[str, dict[str, float], str] | None:
        """The metric to balance, its donors with their throughput budgets, and a note; None if nothing to do.

        Workers whose reports do not show their last moves yet take part with the leader's projected values.
        """
        damp = self.config.dampening_percentage / 100.0
        best: tuple[str, dict[str, float], str] | None = None
        best_total = 0.0
        for metric, avg in self.averages.items():
            holders = [wid for wid in self.active if metric in self.values[wid]]
            half = self.half_band(metric)
            upper, lower = avg + half, avg - half
            vals = {wid: self.confirmed[wid][metric] for wid in holders}  # what persisted (FleetState._confirm)
            lim = {wid: self.limits[wid][metric] for wid in holders}
            triggered = any(v > upper or v < lower or v > lim[w] for w, v in vals.items())
            if not triggered:
                continue
            donors = [w for w, v in vals.items() if v >= upper or v > lim[w]]
            if not donors:
                donors = [min(holders, key=lambda w: (-vals[w], w))]
            budgets: dict[str, float] = {}
            for wid in donors:
                v = vals[wid]
                ref = min(avg, lim[wid]) if v > lim[wid] else avg
                if v > 0 and v > ref:
                    budgets[wid] = self.ledger.throughput.get(wid, 0.0) * (v - ref) / v * damp
            total = sum(budgets.values())
            if budgets and (total > best_total or best is None):
                note = f"balancing {metric}: avg {avg:.2f}, band [{lower:.2f}, {upper:.2f}], {len(budgets)} donor(s)"
                best, best_total = (metric, budgets, note), total
        return best

    def _pick(self, donor: str, budget: float) -> list[str]:
        """The donor's leases to give away: largest first while `remaining - x > 0`, else the smallest (overshoot)."""
        ledger = self.ledger
        keys = [k for k in ledger.held_by.get(donor, {}) if ledger.rebalanceable(k)]
        if not keys or donor in self.stale:
            return []
        # Between leases of equal weight, first those of the stream the donor holds most leases of (multi-stream
        # applications: a stream is not left piled on one worker); single-stream keys all tie on this.
        per_stream = self.stream_counts(donor)
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
        if not chosen and self.config.allow_throughput_overshoot:
            chosen.append(keys[-1])
        return chosen

    def _fits(self, wid: str, projected: Mapping[str, float], donor: str, metric: str, key: str) -> bool:
        """Whether a receiver may take the lease: within its range and at most the average (KCL's rule).

        With `allow_receiver_above_average`, a receiver that stays inside the band and not above the donor after the
        move is accepted too: with few, uneven leases per worker no lease fits under the average, and a donor above
        the band would otherwise stay there.
        """
        limits = self.limits[wid]
        if any(v > limits[m] for m, v in projected.items()):
            return False
        if all(v <= self.averages[m] for m, v in projected.items()):
            return True
        if not self.config.allow_receiver_above_average:
            return False
        donor_after = self.values[donor][metric] - self.drop(donor, metric, key)
        inside = all(v < self.averages[m] + self.half_band(m) for m, v in projected.items())
        return inside and metric in projected and projected[metric] <= donor_after

    def _give(self, heap: list[HeapEntry], key: str, donor: str, metric: str, budget: float) -> None:
        """Move one donor lease to the first of a few most-room receivers that stays within average and range."""
        weight = self.ledger.weight[key]
        drop_pct = 100.0 * self.drop(donor, metric, key) / self.averages[metric] if self.averages[metric] else 0.0
        set_aside: list[HeapEntry] = []
        for _ in range(RECEIVER_PROBES):
            if not heap:
                break
            entry = heapq.heappop(heap)
            wid = entry[2]
            set_aside.append(entry)
            if wid == donor or self.ledger.leases[key].avoids(wid):  # never back to a worker that gave it back
                continue
            projected = self.projected(wid, weight)
            if not self._fits(wid, projected, donor, metric, key):
                continue
            rise_pct = max(
                (100.0 * (projected[m] - self.values[wid][m]) / self.averages[m] if self.averages[m] else 0.0)
                for m in projected
            )
            if drop_pct + rise_pct < self.config.rebalance_dead_band_percentage:
                break
            set_aside.pop()
            before = self.values[donor][metric]
            detail = (
                f"donor {metric}={before:.2f} avg {self.averages[metric]:.2f} budget {budget:.1f} KiB/s; "
                f"lease {weight:.1f} KiB/s; receiver room {-entry[0]:.3g}"
            )
            self.apply(key, wid, MoveReason.for_metric(metric), detail)
            self._requeue(heap, wid)
            break
        for entry in set_aside:
            heapq.heappush(heap, entry)

    def _balance(self, notes: list[str]) -> None:
        chosen = self._donors()
        if chosen is None:
            notes.append("balancing: no metric out of band")
            return
        metric, budgets, note = chosen
        notes.append(note)
        heap = self._queue()
        for donor in sorted(budgets, key=lambda w: (-budgets[w], w)):
            for key in self._pick(donor, budgets[donor]):
                self._give(heap, key, donor, metric, budgets[donor])

class KclVarianceDecider:
    """The `kcl-variance` strategy behind the `Decider` protocol."""

    name = NAME

    def plan(self, snapshot: Snapshot, config: DeciderConfig, balance: bool) -> Plan:
        """Priority assignment, drain, and (if `balance`) KCL's dampened-budget balancing."""
        return KclVarianceFleet(snapshot, config).plan(balance)
