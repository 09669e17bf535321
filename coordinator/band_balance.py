"""Band balancing, strategy `variance`'s default: workers outside the band get back into it with few moves.

KCL gives each donor a dampened budget (60 % of its excess over the average) and walks its leases while they fit
under it, so a donor moves its small leases first and a fleet needs many balancing runs and extra moves to settle
(docs/kcl-differences.md has the fleet-simulator figures). Here the band decides what moves:

* shed: each worker above the band (or its operating range), most excess first, gives away the lease that lands it
  inside the band closest to the average (what the workers below it lack); if no single lease does, its largest
  lease that keeps it above the band, and so on. Each lease goes to the least loaded worker that stays inside the
  band and ends below the giver's value before the move (the pair's peak falls; the next run cannot undo it).
  When no worker can take any of the donor's leases inside the band (few, lumpy leases: a shard that just turned
  hot), the donor trades a lease for a lighter one of the receiver (swap), or, far above the band, hands its lease
  to a worker that sheds enough lighter leases in the same run (push).
* A worker whose heaviest lease alone would put it above the band may keep that lease plus half a band: shedding
  everything else would move many shards and still leave it above.
* fill: each worker far below the band (a band's width under it: a new or long-idle worker), least loaded first,
  takes from the workers above the average the lease that lands it closest to the average without pushing the
  giver below the band or below the receiver.

Moves below `rebalance_dead_band_percentage` are not made, leases balancing moved recently stay put (the leader's
cooldown), and every receiver respects `max_leases_for_worker`, `max_throughput_per_host_kbps` and its operating
range, as in KCL mode. `dampening_percentage` applies to KCL mode only: the leader's catch-up of lagging reports
(`VarianceDecider`) and the receiver rule above take its place.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.moves import MoveReason

if TYPE_CHECKING:
    from coordinator.variance import VarianceDecider

# How many of the least (or most) loaded workers one lease is tried against: bounds a run's cost on big fleets.
PROBES = 8
# A worker takes part in at most this many moves per side in one run; a safety bound, never reached in practice.
MAX_MOVES_PER_WORKER = 64
# Relative slack on the band's edges, so a value computed to sit exactly on an edge counts as inside.
ROUNDING = 1e-9


@dataclass(frozen=True, slots=True)
class Band:
    """The balanced band of one metric: average, lower and upper edge."""

    metric: str
    avg: float
    lower: float
    upper: float


def metric_to_balance(decider: VarianceDecider) -> Band | None:
    """The metric whose workers stray furthest outside the band (summed distance), or None if all are inside."""
    best: tuple[float, Band] | None = None
    for metric, avg in decider.averages.items():
        half = decider.half_band(metric)
        slack = ROUNDING * max(1.0, abs(avg))  # a worker exactly on an edge is inside, whatever the float rounding
        band = Band(metric, avg, avg - half - slack, avg + half + slack)
        stray = 0.0
        for wid in decider.active:
            value = decider.values[wid].get(metric)
            if value is None or wid in decider.unsettled:
                continue
            ceiling = min(band.upper, decider.limits[wid][metric])
            stray += max(0.0, value - ceiling) + max(0.0, band.lower - value)
        if stray > 0 and (best is None or stray > best[0]):
            best = (stray, band)
    return None if best is None else best[1]


class BandBalancer:
    """One balancing pass on one metric over a `VarianceDecider`'s in-memory state (values, ledger)."""

    def __init__(self, decider: VarianceDecider, band: Band) -> None:
        self.d = decider
        self.band = band
        self.metric = band.metric
        self.reason = MoveReason.for_metric(band.metric)
        self.holders = [wid for wid in decider.active
                        if self.metric in decider.values[wid] and wid not in decider.unsettled]

    # -- helpers ---------------------------------------------------------------------------------------------------
    def value(self, wid: str) -> float:
        """The worker's current (in-memory, projected) value of the balanced metric."""
        return self.d.values[wid][self.metric]

    def ceiling(self, wid: str) -> float:
        """Highest value the worker may keep: the band's upper edge or its operating range, whichever is lower.

        A worker whose heaviest lease alone would put it above that (one shard hotter than a fair share) may keep
        that lease plus half a band: shedding all of its other leases would move many shards and still leave it
        above the band.
        """
        d = self.d
        edge = min(self.band.upper, d.limits[wid][self.metric])
        weights = [d.ledger.weight[k] for k in d.ledger.held_by.get(wid, {})]
        if not weights or wid in d.default:
            return edge
        line = d.lines[self.metric]
        alone = line.base + line.slope * max(weights)
        return max(edge, alone + (self.band.upper - self.band.avg))

    def margin(self) -> float:
        """How far below the band a worker must be before leases are pulled to it: the dead-band (KCL #1814)."""
        return self.band.avg * self.d.config.rebalance_dead_band_percentage / 100.0

    def _ordered(self, descending: bool) -> Iterator[str]:
        """Holders from least (or most) loaded on, re-reading values as moves change them (lazy heap)."""
        sign = -1.0 if descending else 1.0
        heap = [(sign * self.value(w), w) for w in self.holders]
        heapq.heapify(heap)
        while heap:
            key, wid = heapq.heappop(heap)
            if key != sign * self.value(wid):
                heapq.heappush(heap, (sign * self.value(wid), wid))
                continue
            yield wid

    def _receiver_fits(self, wid: str, key: str, giver_before: float) -> float | None:
        """The receiver's value after taking `key`, if it stays inside every band and range and below the giver.

        Below the giver's value before the move, so the pair's peak falls and the next run cannot undo the move.
        """
        d = self.d
        if not d.assignable(wid):
            return None
        projected = d.projected(wid, d.ledger.weight[key])
        for metric, value in projected.items():
            if value > min(d.averages[metric] + d.half_band(metric), d.limits[wid][metric]):
                return None
        after = projected[self.metric]
        return after if after < giver_before else None

    def _worth_it(self, giver: str, receiver: str, key: str, receiver_after: float) -> bool:
        """False if the move changes the gap between the two by less than the dead-band (KCL #1814)."""
        avg = self.band.avg
        if avg <= 0:
            return True
        change = self.d.drop(giver, self.metric, key) + receiver_after - self.value(receiver)
        return 100.0 * change / avg >= self.d.config.rebalance_dead_band_percentage

    def _move(self, key: str, giver: str, receiver: str, landed: float, why: str) -> None:
        b, before = self.band, self.value(giver)
        after = before - self.d.drop(giver, self.metric, key)
        detail = (f"{why}; band [{b.lower:.2f}, {b.upper:.2f}] avg {b.avg:.2f}; {self.metric} {giver} "
                  f"{before:.2f} -> {after:.2f}, {receiver} {self.value(receiver):.2f} -> {landed:.2f}")
        self.d.apply(key, receiver, self.reason, detail)

    # -- shed ------------------------------------------------------------------------------------------------------
    def shed(self) -> None:
        """Bring every worker above its ceiling back under it, most excess first."""
        over = [w for w in self.holders if self.value(w) > self.ceiling(w)]
        over.sort(key=lambda w: (-(self.value(w) - self.ceiling(w)), w))
        for donor in over:
            for _ in range(MAX_MOVES_PER_WORKER):
                if self.value(donor) <= self.ceiling(donor) or not self._shed_one(donor):
                    break

    def _target(self, donor: str) -> float:
        """Where a donor should land: the average (what its receivers lack), or below an operating range under it."""
        return min(self.band.avg, self.ceiling(donor) - (self.band.upper - self.band.avg) / 2)

    def _shed_candidates(self, donor: str) -> list[str]:
        """The donor's movable leases in order of preference (by its value after giving each away)."""
        d, value, ceiling = self.d, self.value(donor), self.ceiling(donor)
        target = self._target(donor)
        landing, short, beyond = [], [], []
        for key in d.ledger.held_by.get(donor, {}):
            if not d.ledger.rebalanceable(key):
                continue
            after = value - d.drop(donor, self.metric, key)
            if after > ceiling:
                short.append((key, after))
            elif after >= self.band.lower:
                landing.append((key, after))
            else:
                beyond.append((key, after))
        landing.sort(key=lambda c: (abs(c[1] - target), c[0]))
        short.sort(key=lambda c: (c[1], c[0]))  # the biggest step towards the band first
        beyond.sort(key=lambda c: (-c[1], c[0]))  # the smallest overshoot first
        ordered = landing + short + (beyond if d.config.allow_throughput_overshoot else [])
        return [key for key, _ in ordered]

    def _shed_one(self, donor: str, trades: bool = True, cap: float = math.inf) -> bool:
        """One move (or trade, if `trades`) that brings the donor towards its ceiling; False if there is none.

        Receivers end below the donor's value and below `cap` (a push's original peak).
        """
        for key in self._shed_candidates(donor):
            probed = 0
            for receiver in self._ordered(descending=False):
                if receiver == donor:
                    continue
                probed += 1
                if probed > PROBES:
                    break
                landed = self._receiver_fits(receiver, key, min(self.value(donor), cap))
                if landed is not None and self._worth_it(donor, receiver, key, landed):
                    self._move(key, donor, receiver, landed, "above the band: shed")
                    return True
        return trades and (self._swap_one(donor) or self._push_one(donor))

    def _push_one(self, donor: str) -> bool:
        """Hand a lease too heavy for anyone to a worker that can then shed enough lighter leases to stay in band.

        The last resort for a worker holding several hot shards: each is heavier than any other worker's room, so
        it moves only if its receiver can give away enough of its own lighter leases in the same run to get back to
        the average (and the lease cannot bounce back: balancing leaves it alone for a while).
        """
        d, metric, peak = self.d, self.metric, self.value(donor)
        if peak <= self.band.upper:  # only above the band itself, not merely above an operating range inside it
            return False
        for key in self._shed_candidates(donor):
            weight = d.ledger.weight[key]
            for receiver in itertools.islice(self._ordered(descending=False), PROBES + 1):
                if receiver == donor or not d.assignable(receiver):
                    continue
                landed = d.projected(receiver, weight)[metric]
                bound = min(self.ceiling(receiver), peak)
                if landed <= bound or landed > d.limits[receiver][metric]:
                    continue  # it fits (a plain move was refused for another reason), or it breaks the range
                light = [d.drop(receiver, metric, k) for k in d.ledger.held_by.get(receiver, {})
                         if d.ledger.rebalanceable(k) and d.ledger.weight[k] < weight]
                if sum(light) < landed - min(bound, self.band.avg):
                    continue
                self._move(key, donor, receiver, landed, "above the band: push (the receiver sheds next)")
                for _ in range(MAX_MOVES_PER_WORKER):
                    if self.value(receiver) <= bound or not self._shed_one(receiver, trades=False, cap=peak):
                        break
                return True
        return False

    def _swap_one(self, donor: str) -> bool:
        """No receiver can take any donor lease inside the band: trade one for a lighter lease of the receiver.

        With few, lumpy leases per worker (a shard that just turned hot), the donor's smallest lease can be too big
        for every other worker, while giving it and taking back a lighter one lands both inside the band.
        """
        d, metric, value = self.d, self.metric, self.value(donor)
        ceiling, target = self.ceiling(donor), self._target(donor)
        if not d.assignable(donor):
            return False
        best: tuple[float, str, str, str] | None = None
        keys = [k for k in d.ledger.held_by.get(donor, {}) if d.ledger.rebalanceable(k)]
        receivers = [w for w in itertools.islice(self._ordered(descending=False), PROBES + 1) if w != donor][:PROBES]
        for receiver in receivers:
            if not d.assignable(receiver):
                continue
            r_value, r_ceiling = self.value(receiver), self.ceiling(receiver)
            returns = [j for j in d.ledger.held_by.get(receiver, {}) if d.ledger.rebalanceable(j)]
            for key in keys:
                weight = d.ledger.weight[key]
                given = value - d.drop(donor, metric, key)
                taken = d.projected(receiver, weight)[metric] - r_value
                for back in returns:
                    if d.ledger.weight[back] >= weight:
                        continue
                    d_after = given + d.projected(donor, d.ledger.weight[back])[metric] - value
                    r_after = r_value + taken - d.drop(receiver, metric, back)
                    if not (self.band.lower <= d_after <= ceiling and r_after <= r_ceiling and r_after < value):
                        continue
                    score = abs(d_after - target) + abs(r_after - self.band.avg)
                    if best is None or score < best[0]:
                        best = (score, receiver, key, back)
        if best is None:
            return False
        _, receiver, key, back = best
        self._move(key, donor, receiver, d.projected(receiver, d.ledger.weight[key])[metric], "swap: give")
        self._move(back, receiver, donor, d.projected(donor, d.ledger.weight[back])[metric], "swap: take back")
        return True

    # -- fill ------------------------------------------------------------------------------------------------------
    def fill(self) -> None:
        """Lift every worker below the band into it, least loaded first, from the most loaded workers."""
        # Far below: a band's width under the average (a new or long-idle worker). Lifting one just under the
        # band would cost moves without lowering any peak.
        floor = self.band.lower - (self.band.avg - self.band.lower) - self.margin()
        if self.d.count_only:  # idle stream: only a worker with less than half the average count (a new one)
            floor = min(floor, self.band.avg / 2)
        under = sorted((w for w in self.holders if self.value(w) < floor), key=lambda w: (self.value(w), w))
        for receiver in under:
            for _ in range(MAX_MOVES_PER_WORKER):
                if self.value(receiver) >= self.band.lower or not self._fill_one(receiver):
                    break

    def _fill_one(self, receiver: str) -> bool:
        d, best, best_score = self.d, None, None
        probed = 0
        for giver in self._ordered(descending=True):
            if self.value(giver) <= self.band.avg or probed >= PROBES:
                break
            if giver == receiver:
                continue
            probed += 1
            for key in d.ledger.held_by.get(giver, {}):
                if not d.ledger.rebalanceable(key):
                    continue
                giver_after = self.value(giver) - d.drop(giver, self.metric, key)
                if giver_after < self.band.lower:
                    continue
                landed = self._receiver_fits(receiver, key, self.value(giver))
                if landed is None or not self._worth_it(giver, receiver, key, landed):
                    continue
                # Landing inside the band, closest to the average, beats any partial lift; else the biggest lift.
                score = (0, abs(landed - self.band.avg)) if landed >= self.band.lower else (1, -landed)
                if best_score is None or score < best_score:
                    best, best_score = (key, giver, landed), score
        if best is None:
            return False
        key, giver, landed = best
        self._move(key, giver, receiver, landed, "below the band: fill")
        return True


def balance_band(decider: VarianceDecider, notes: list[str]) -> None:
    """One band-balancing pass: shed, then fill, on the metric furthest out of band."""
    band = metric_to_balance(decider)
    if band is None:
        notes.append("balancing: no metric out of band")
        return
    notes.append(f"balancing {band.metric} (band): avg {band.avg:.2f}, band [{band.lower:.2f}, {band.upper:.2f}]")
    balancer = BandBalancer(decider, band)
    balancer.shed()
    balancer.fill()

