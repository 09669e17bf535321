"""Strategy `band`'s moves (coordinator/deciders/band.py): workers outside the band get back into it in few moves.

KCL gives each donor a dampened budget (60 % of its excess over the average) and walks its leases while they fit
under it, so a donor moves its small leases first and a fleet needs many balancing runs and extra moves to settle
(docs/kcl-differences.md has the fleet-simulator figures). Here the band decides what moves:

* shed: each worker above the band (or its operating range), most excess first, gives away the lease that lands it
  inside the band closest to the average (what the workers below it lack); if no single lease does, the one that
  lands it least far under the band while a noise margin above the fill floor (`low_landing`: one move, where two
  lighter leases would land it inside); else its largest lease that keeps it above the band, and so on. Each lease
  goes to a worker that stays inside the band and ends below the giver's value before the move (the pair's peak
  falls; the next run cannot undo it): the one it lands nearest the average a noise margin under the edge (the
  least loaded while new workers are far below the band).
  When no worker can take any of the donor's leases inside the band (few, lumpy leases: a shard that just turned
  hot), the donor trades a lease for a lighter one of the receiver (swap), or, far above the band, hands its lease
  to a worker that sheds enough lighter leases in the same run (push).
* A worker whose heaviest lease alone would put it above the band (at the worker's own load per KiB/s) may keep
  that lease plus half a band: shedding everything else would move many shards and still leave it above.
* fill: each worker far below the band (a band's width under it: a new or long-idle worker), least loaded first,
  takes from the workers above the average the lease that lands it closest to the average without pushing the
  giver below the band or below the receiver.
* fill on throughput (`fill_on_share`): when no worker is out of its metric's band, a worker holding nothing, far
  below the throughput band in every report of the persistence window and not busy by its own metric, is filled on
  throughput: agents' own CPU on a light stream cannot tell a new agent from the others (decision 0014).

A pass follows one `Style`: the usual order above, or (planned by `BandDecider` when the usual pass made a donor give
more than one lease) deep sheds first, the heaviest leases' donors first, or trades first; the plan with the fewest
moves that leaves no more workers out of band, none nearer its ceiling, is kept (decision 0016).

Every move (a swap or push as a whole) must lower the peak of the workers it involves by at least the decider's
`min_gain` (the dead-band share of the average, and at least `rebalance_min_gain_kbps` or `_points`): figures
measured on live traffic carry noise, and a move worth less than that noise is undone by the next run's numbers (the
live stack moved a lease every few seconds, bench/churn.py). Leases balancing moved recently stay put (the leader's
cooldown), workers whose heartbeat is not fresh neither give nor receive, and every receiver respects
`max_leases_for_worker`, `max_throughput_per_host_kbps` and its operating range, as in strategy `kcl-variance`.
`dampening_percentage` applies to `kcl-variance` only: the leader's catch-up of lagging reports (`FleetState`) and
the receiver rule above take its place.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from dataclasses import dataclass

from shardherd.coordinator.deciders.fleet_state import FleetState
from shardherd.coordinator.moves import Move, MoveReason
from shardherd.shared.streams import stream_prefix
from shardherd.shared.worker import THROUGHPUT_METRIC

# How many of the least (or most) loaded workers one lease is tried against: bounds a run's cost on big fleets.
PROBES = 8
# A worker takes part in at most this many moves per side in one run; a safety bound, never reached in practice.
MAX_MOVES_PER_WORKER = 64
# A donor's orders (`BandBalancer._shed_fewest`), by how many of its first steps try a trade or push first: none (the
# usual), one (a donor holding two hot shards pushes one, then sheds light leases), or every step.
EVERY_STEP = MAX_MOVES_PER_WORKER
DONOR_ORDERS = (0, 1, EVERY_STEP)
# Relative slack on the band's edges, so a value computed to sit exactly on an edge counts as inside.
ROUNDING = 1e-9


@dataclass(frozen=True, slots=True)
class Band:
    """The balanced band of one metric: average, lower and upper edge."""

    metric: str
    avg: float
    lower: float
    upper: float


@dataclass(frozen=True, slots=True)
class Style:
    """How a balancing pass orders a donor's options; `BandDecider` plans with each and keeps the fewest moves.

    `deep`: a lease that lands the donor below `low_landing` (even below the fill floor) comes before steps that
    leave it above the band, so it ends its excess in one move and other donors' sheds may refill it in the same run.
    `trade_first`: a donor tries a swap or push of a heavy lease before shedding light ones.
    `heavy_first`: donors holding the heaviest movable leases shed first (most excess first otherwise), so the
    biggest lumps are placed while the new or emptied workers still have room for them.
    `safe`: every worker a move touches must end the minimum gain under its ceiling (donors too), so no figure's
    noise puts it above again.
    """

    deep: bool = False
    trade_first: bool = False
    heavy_first: bool = False
    safe: bool = False

    @property
    def name(self) -> str:
        """How plan notes name the style."""
        parts = [part for part, on in (("deep sheds", self.deep), ("trades first", self.trade_first),
                                       ("heaviest leases first", self.heavy_first),
                                       ("a noise margin under every ceiling", self.safe)) if on]
        return " and ".join(parts) or "the usual order"


USUAL = Style()
# The alternatives `BandDecider` tries when the usual pass made a donor shed more than once (decision 0016).
ALTERNATIVES = (Style(deep=True), Style(deep=True, heavy_first=True), Style(trade_first=True),
                Style(deep=True, trade_first=True))
# Tried when the plan kept lands some worker it moved within the minimum gain under its ceiling (decision 0017).
SAFE = Style(safe=True)


@dataclass(frozen=True, slots=True)
class Landing:
    """Where a pass or a donor's order left workers.

    `outside`: workers out of band (above their ceiling or below the fill floor); `closest`: how near the fullest
    worker that gave or took a lease ends to its ceiling (value minus ceiling).
    """

    outside: int
    closest: float

    def lands_as_well(self, other: Landing, margin: float) -> bool:
        """No more workers out of band than `other`, and none nearer its ceiling than `margin` or `other`'s nearest."""
        return self.outside <= other.outside and self.closest <= max(other.closest, -margin)


@dataclass(frozen=True, slots=True)
class Outcome(Landing):
    """What a balancing pass left, as `BandDecider` compares styles (`outside` over every balanced worker).

    `repeated`: some donor gave more than one lease (only then may another style need fewer moves).
    """

    repeated: bool
    margin: float  # the minimum gain: a worker this far under its ceiling is safe from the next figures' noise
    risk: float  # how many of the moved workers the next figures may put above their ceiling (`landing_risk`)

    def no_worse(self, other: Outcome) -> bool:
        """Whether this pass is as good a landing as `other`: no more workers out of band.

        And every worker it moved ends a noise margin under its ceiling, or no nearer to it than `other`'s nearest.
        """
        return self.lands_as_well(other, self.margin)

    def safer(self, other: Outcome, moves: int, other_moves: int) -> bool:
        """Whether this pass, landing every moved worker the margin under its ceiling, is worth its extra moves.

        `other` lands some worker nearer: each such worker is expected to shed again in a later run with the
        probability `landing_risk` gives, so extra moves now, at most that expected number, save moves on average
        and leave no later balancing run to chance.
        """
        return not self.risk and self.outside <= other.outside and moves - other_moves <= other.risk


@dataclass(frozen=True, slots=True)
class Shed(Landing):
    """What shedding one donor in one order did (`BandBalancer._shed_fewest` compares orders): its moves too."""

    moves: int


def leases_to_cover(weights: list[float], needed: float) -> int:
    """How many of `weights`, largest first, add up to `needed` (one more than all of them if they cannot).

    The push's receiver choice here and the fleet simulator's minimum (bench/fleet/measures.py) count sheds alike.
    """
    count, total = 0, 0.0
    for weight in sorted(weights, reverse=True):
        if total >= needed:
            break
        total += weight
        count += 1
    return count if total >= needed else len(weights) + 1


def landing_risk(gap: float, margin: float) -> float:
    """How likely a worker that ends `gap` under its ceiling is put above it again by the next figures.

    1 at the ceiling, falling linearly to 0 at the margin (the minimum gain: the figures' noise); 0 above the ceiling
    (out of band, counted apart). A model fitted on few runs, not measured: on the fleet simulator's hot-shard runs,
    workers landed 0.01-1.2 points under a 2-point margin went above again where the sum came to 1.1-1.7 and stayed
    where it came to 0.87-0.97; on one scale-out run they stayed at 1.14 (decision 0017).
    """
    return 0.0 if gap < 0 or gap >= margin else 1.0 - gap / margin


def metric_to_balance(fleet: FleetState) -> Band | None:
    """The metric whose workers stray furthest outside the band (summed distance), or None if all are inside."""
    best: tuple[float, Band] | None = None
    for metric, avg in fleet.averages.items():
        half = fleet.half_band(metric)
        slack = ROUNDING * max(1.0, abs(avg))  # a worker exactly on an edge is inside, whatever the float rounding
        band = Band(metric, avg, avg - half - slack, avg + half + slack)
        stray = 0.0
        for wid in fleet.active:
            value = fleet.confirmed[wid].get(metric)  # only what persisted over the last reports sets balancing off
            if value is None:
                continue
            ceiling = min(band.upper, fleet.limits[wid][metric])
            stray += max(0.0, value - ceiling) + max(0.0, band.lower - value)
        if stray > 0 and (best is None or stray > best[0]):
            best = (stray, band)
    return None if best is None else best[1]


class BandBalancer:
    """One balancing pass on one metric over a fleet's in-memory state (values, ledger; `FleetState`'s public part)."""

    def __init__(self, fleet: FleetState, band: Band, style: Style = USUAL) -> None:
        self.d = fleet
        self.band = band
        self.style = style
        self.metric = band.metric
        self.reason = MoveReason.for_metric(band.metric)
        self.min_gain = fleet.min_gain(band.metric)
        self.holders = [wid for wid in fleet.active if self.metric in fleet.values[wid]]
        self._holding = set(self.holders)
        # Lazy heaps of (value, worker) and (-value, worker): entries go stale when a move changes a value and are
        # skipped then; `_move` pushes the fresh ones. So finding the least (most) loaded workers is cheap.
        self._low = [(self.value(w), w) for w in self.holders]
        self._high = [(-self.value(w), w) for w in self.holders]
        heapq.heapify(self._low)
        heapq.heapify(self._high)
        self._by_weight: dict[str, list[tuple[float, str]]] = {}  # movable leases by weight, per worker
        self._heaviest: dict[str, float] = {}  # heaviest lease held, per worker
        self._shed_from: dict[str, float] = {}  # each donor's value before it started shedding in this run
        self._safety = 0.0  # how far under the band's edge ceilings sit while a donor sheds in the `safe` style

    # -- helpers ---------------------------------------------------------------------------------------------------
    def value(self, wid: str) -> float:
        """The worker's current (in-memory, projected) value of the balanced metric."""
        return self.d.values[wid][self.metric]

    def confirmed(self, wid: str) -> float:
        """The worker's value as far from the average as its last reports agree (`FleetState.confirmed`).

        A worker sheds only if this too is above its ceiling, and is filled only if this too is below the floor:
        an excess seen in the newest report alone (a few seconds of CPU spike or dip) moves nothing.
        """
        return self.d.confirmed[wid][self.metric]

    def ceiling(self, wid: str) -> float:
        """Highest value the worker may keep: the band's upper edge or its operating range, whichever is lower.

        A worker whose heaviest lease alone would put it above that (one shard hotter than a fair share) may keep
        that lease plus half a band: shedding all of its other leases would move many shards and still leave it
        above the band. "Alone" is the worker's own value minus what its other leases add at its own rate (the
        same rate its sheds are priced at); the fleet's line would misjudge a worker that sits off it.
        """
        d = self.d
        edge = min(self.band.upper, d.limits[wid][self.metric]) - self._safety
        rate = d.drop_rate(wid, self.metric)
        if wid in d.default or rate is None:
            return edge
        heaviest = self._heaviest.get(wid)
        if heaviest is None:
            held = d.ledger.held_by.get(wid, {})
            heaviest = self._heaviest[wid] = max((d.ledger.weight[k] for k in held), default=0.0)
        alone = self.value(wid) - rate * (d.ledger.throughput[wid] - heaviest)
        return alone + (self.band.upper - self.band.avg) - self._safety if alone > edge else edge

    def margin(self) -> float:
        """How far below the band a worker must be before leases are pulled to it: the dead-band (KCL #1814)."""
        return self.band.avg * self.d.config.rebalance_dead_band_percentage / 100.0

    def _extremes(self, count: int, lowest: bool, exclude: str) -> list[str]:
        """Up to `count` of the least (or most) loaded holders other than `exclude`, in that order."""
        heap, sign = (self._low, 1.0) if lowest else (self._high, -1.0)
        found: list[str] = []
        kept: list[tuple[float, str]] = []
        seen: set[str] = set()
        while heap and len(found) < count:
            entry = heapq.heappop(heap)
            wid = entry[1]
            if wid in seen or entry[0] != sign * self.value(wid):
                continue  # stale: a move changed this worker's value and pushed a fresh entry
            seen.add(wid)
            kept.append(entry)
            if wid != exclude:
                found.append(wid)
        for entry in kept:
            heapq.heappush(heap, entry)
        return found

    def _movable(self, wid: str) -> list[tuple[float, str]]:
        """The worker's leases balancing may move, as (weight, key) sorted by weight."""
        cached = self._by_weight.get(wid)
        if cached is None:
            ledger = self.d.ledger
            # A possibly dead worker gives nothing; nor does one whose leases' figures are still changing.
            held = () if wid in self.d.stale or wid in self.d.settling else ledger.held_by.get(wid, {})
            cached = sorted((ledger.weight[k], k) for k in held if ledger.rebalanceable(k))
            self._by_weight[wid] = cached
        return cached

    def _max_weight(self, receiver: str, giver_before: float = math.inf) -> float:
        """The heaviest lease the receiver could take and stay inside every band and range and below the giver."""
        d, most = self.d, math.inf
        for metric, value in d.values[receiver].items():
            per_kbps = d.rise(receiver, metric, 1.0)
            bound = d.band_ceiling(receiver, metric)
            if metric == self.metric:
                bound = min(bound, giver_before)
            if per_kbps > 0:
                most = min(most, (bound - value) / per_kbps)
        return most

    def _takes_part(self, wid: str) -> bool:
        """Whether the worker may receive in this run: assignable, and its figures are not still changing."""
        return self.d.assignable(wid) and wid not in self.d.settling

    def _refused(self, key: str, receiver: str) -> bool:
        """True if the receiver gave this lease back as one it cannot process: balancing never hands it back."""
        return self.d.ledger.leases[key].avoids(receiver)

    def _worth(self, change: float) -> bool:
        """False if a move changes the gap between giver and receiver by less than the dead-band (KCL #1814)."""
        avg = self.band.avg
        return avg <= 0 or 100.0 * change / avg >= self.d.config.rebalance_dead_band_percentage

    def _move(self, key: str, giver: str, receiver: str, landed: float, why: str) -> None:
        b, before = self.band, self.value(giver)
        after = before - self.d.drop(giver, self.metric, key)
        detail = (f"{why}; band [{b.lower:.2f}, {b.upper:.2f}] avg {b.avg:.2f}; {self.metric} {giver} "
                  f"{before:.2f} -> {after:.2f}, {receiver} {self.value(receiver):.2f} -> {landed:.2f}")
        self.d.apply(key, receiver, self.reason, detail)
        # The lease leaves the giver's movable list and joins nobody's: it has moved in this run.
        weight = self.d.ledger.weight[key]
        movable = self._by_weight.get(giver)
        if movable is not None:
            at = bisect.bisect_left(movable, (weight, key))
            if at < len(movable) and movable[at] == (weight, key):
                del movable[at]
        if self._heaviest.get(giver) == weight:
            del self._heaviest[giver]
        if receiver in self._heaviest:
            self._heaviest[receiver] = max(self._heaviest[receiver], weight)
        for wid in (giver, receiver):
            if wid in self._holding:
                heapq.heappush(self._low, (self.value(wid), wid))
                heapq.heappush(self._high, (-self.value(wid), wid))

    # -- shed ------------------------------------------------------------------------------------------------------
    def shed(self) -> None:
        """Bring every worker whose excess its reports confirm back under its ceiling, most excess first."""
        self._shed_all([w for w in self.holders if min(self.value(w), self.confirmed(w)) > self.ceiling(w)])

    def shed_unconfirmed(self) -> None:
        """In a pass that moved leases, shed the workers whose moving average alone is above their ceiling too.

        Confirmation keeps noise from starting moves in a settled fleet. Once a real change moves leases anyway (a
        scale-out, a hot shard), a worker whose average is just over its ceiling while an older low report keeps
        its excess unconfirmed would otherwise stay over the band for the whole persistence window (fleet_sim,
        scale-out, seed 7: 0.56 points over for 30 s, until its reports from before the scale-out aged out).
        """
        if any(move.reason is self.reason for move in self.d.ledger.moves.values()):
            self._shed_all([w for w in self.holders if w not in self._shed_from and self.value(w) > self.ceiling(w)])

    def _shed_all(self, over: list[str]) -> None:
        """Shed each of these workers back under its ceiling, in the style's donor order."""
        if self.style.heavy_first:
            over.sort(key=lambda w: (-max((weight for weight, _ in self._movable(w)), default=0.0), w))
        else:
            over.sort(key=lambda w: (-(self.value(w) - self.ceiling(w)), w))
        for donor in over:
            self._shed_from[donor] = self.value(donor)
            self._shed_fewest(donor)

    def _shed_fewest(self, donor: str) -> None:
        """Shed the donor in the style's order; if that took more than one move, try the other orders too.

        The orders (`DONOR_ORDERS`): light sheds one by one (trading or pushing a heavy lease only where the light
        ones cannot get it into the band), one trade or push of a heavy lease first and then that, or trades and
        pushes first at every step; a push's receiver's sheds count with the donor's. Another order replaces the
        one kept so far only if it makes fewer moves, leaves no more of the workers it moved out of band and none
        nearer its ceiling than the minimum gain or the kept order's nearest.
        """
        mark = len(self.d.ledger.moves)
        own = EVERY_STEP if self.style.trade_first else 0
        kept, best = own, self._shed_donor(donor, own, mark)
        if best.moves <= 1 or self.d.drop_rate(donor, self.metric) is None:
            return
        last = own
        for order in DONOR_ORDERS:
            if order == own:
                continue
            self._rewind(mark)
            other, last = self._shed_donor(donor, order, mark), order
            if other.moves < best.moves and other.lands_as_well(best, self.min_gain):
                kept, best = order, other
        if kept != last:
            self._rewind(mark)
            self._shed_donor(donor, kept, mark)

    def _shed_donor(self, donor: str, leading_trades: int, mark: int) -> Shed:
        """Shed the donor until it is under its ceiling or nothing moves; what the moves since `mark` did.

        Its first `leading_trades` steps try a trade or push before a light shed.
        """
        self._safety = self.min_gain if self.style.safe else 0.0
        try:
            for step in range(MAX_MOVES_PER_WORKER):
                if (self.value(donor) <= self.ceiling(donor)
                        or not self._shed_one(donor, trade_first=step < leading_trades)):
                    break
        finally:
            self._safety = 0.0
        moves = list(self.d.ledger.moves.values())[mark:]
        moved, closest = self._landing(moves)
        floor = self.floor()
        outside = sum(1 for w in moved if not floor <= self.value(w) <= self.ceiling(w))
        return Shed(outside, closest, len(moves))

    def _landing(self, moves: list[Move]) -> tuple[set[str], float]:
        """The balanced workers these moves touched, and how near the nearest ends to its ceiling (value minus it)."""
        moved = {w for move in moves for w in (move.from_owner, move.to_worker) if w is not None and w in self._holding}
        return moved, max((self.value(w) - self.ceiling(w) for w in moved), default=-math.inf)

    def _rewind(self, mark: int) -> None:
        """Undo this run's moves after the first `mark`, newest first: an option tried and not kept."""
        touched: set[str] = set()
        for key in reversed(list(self.d.ledger.moves)[mark:]):
            giver, taker = self.d.take_back(key)
            touched.update(w for w in (giver, taker) if w is not None)
        for wid in touched:
            self._by_weight.pop(wid, None)
            self._heaviest.pop(wid, None)
            if wid in self._holding:
                heapq.heappush(self._low, (self.value(wid), wid))
                heapq.heappush(self._high, (-self.value(wid), wid))

    def _target(self, donor: str) -> float:
        """Where a donor should land: the average (what its receivers lack), or below an operating range under it."""
        return min(self.band.avg, self.ceiling(donor) - (self.band.upper - self.band.avg) / 2)

    def _shed_candidates(self, donor: str, heaviest: float) -> list[str]:
        """The donor's movable leases up to `heaviest` KiB/s, in order of preference (by its value after each)."""
        d, value, ceiling = self.d, self.value(donor), self.ceiling(donor)
        target, low = self._target(donor), self.low_landing()
        landing, under, short, beyond = [], [], [], []
        movable = self._movable(donor)
        rate = d.drop_rate(donor, self.metric)
        for weight, key in movable[:bisect.bisect_right(movable, (heaviest, "\uffff"))]:
            after = value - (rate * weight if rate is not None else d.drop(donor, self.metric, key))
            if after > ceiling:
                short.append((key, after, weight))
            elif after >= self.band.lower:
                landing.append((key, after, weight))
            elif after >= low:
                under.append((key, after, weight))
            else:
                beyond.append((key, after, weight))
        # Ties go to a lease of the stream the donor holds most of (multi-stream: spread each stream's shards).
        crowd = d.stream_counts(donor)
        landing.sort(key=lambda c: (abs(c[1] - target), -crowd[stream_prefix(c[0])], c[0]))
        short.sort(key=lambda c: (c[1], -crowd[stream_prefix(c[0])], c[0]))  # the biggest step towards the band first
        for overshoot in (under, beyond):
            overshoot.sort(key=lambda c: (-c[1], -crowd[stream_prefix(c[0])], c[0]))  # the smallest overshoot first
        # A lease that ends the donor's excess in one move, a little under the band where nothing fills it, before
        # a step that needs another move after it (decision 0015).
        if not d.config.allow_throughput_overshoot:
            ordered = landing + short
        elif self.style.deep:
            ordered = landing + under + beyond + short
        else:
            ordered = landing + under + short + beyond
        return [key for key, _, _ in ordered]

    def low_landing(self) -> float:
        """The lowest value a donor may shed down to in one move: a noise margin (the minimum gain) above the floor.

        Between the floor and the band's lower edge nothing moves a worker (it is not far below the band), so a
        donor that no single lease lands inside the band may end there in one move instead of shedding two lighter
        leases. The margin keeps the next reports' noise from making it a worker to fill.
        """
        return self.floor() + self.min_gain

    def _shed_one(self, donor: str, trades: bool = True, cap: float = math.inf, trade_first: bool = False) -> bool:
        """One move (or trade, if `trades`) that brings the donor towards its ceiling; False if there is none.

        Receivers end at least `min_gain` below the donor's value and `cap` (a push's original peak); `trade_first`:
        try a swap or push before shedding a light lease.
        """
        d, giver_before, ceiling = self.d, min(self.value(donor), cap), self.ceiling(donor)
        rate = d.drop_rate(donor, self.metric)
        # If its light leases together cannot bring it into the band (it holds several hot shards), trading or
        # pushing a heavy one first saves moving every light one and then the heavy one anyway.
        if (trades and rate is not None and (trade_first or not self._lighter_leases_suffice(donor, rate))
                and (self._swap_one(donor) or self._push_one(donor))):
            return True
        receivers = [(w, self._max_weight(w, giver_before), d.rise(w, self.metric, 1.0))
                     for w in self._extremes(PROBES, True, donor) if self._takes_part(w)]
        heaviest = max((most for _, most, _ in receivers), default=-math.inf)
        for key in self._shed_candidates(donor, heaviest):
            weight = d.ledger.weight[key]
            after = self.value(donor) - (rate * weight if rate is not None else d.drop(donor, self.metric, key))
            if after <= ceiling and self._shed_from.get(donor, giver_before) - after < self.min_gain:
                continue  # the donor's last move, and all its moves together barely change it: within the noise
            chosen = self._receiver_for(key, weight, giver_before, receivers)
            if chosen is not None and (rate is None or self._worth(rate * weight + chosen[2] * weight)):
                self._move(key, donor, chosen[0], self.value(chosen[0]) + chosen[2] * weight, "above the band: shed")
                return True
        return trades and (self._swap_one(donor) or self._push_one(donor))

    def _receiver_for(self, key: str, weight: float, giver_before: float,
                      receivers: list[tuple[str, float, float]]) -> tuple[str, float, float] | None:
        """The receiver a shed lease goes to, of `receivers` (least loaded first); None if none takes it.

        While some worker is far below the band (a new one: room is plentiful) the least loaded, so the new workers
        fill evenly. Otherwise the one the lease lands nearest the average while ending a noise margin (the minimum
        gain) under the band's edge, else the least loaded. Least loaded first gave the roomiest worker a medium
        lease, and a hot donor shedding after it found no room for its heavy lease: it shed two smaller ones, or the
        heavy one landed right under the edge and the next run's noise made its receiver shed again (issue 15).
        """
        fits = [(w, most, per_kbps) for w, most, per_kbps in receivers
                if weight <= most and not self._refused(key, w)
                and self.value(w) + per_kbps * weight <= giver_before - self.min_gain]
        if not fits or self.value(fits[0][0]) < self.floor():
            return fits[0] if fits else None
        margin = min(self.band.upper, giver_before) - self.min_gain
        inside = [r for r in fits if self.value(r[0]) + r[2] * weight <= margin]
        if inside and self._safety:  # the tightest fit: the roomiest workers stay free for heavier leases
            return max(inside, key=lambda r: (self.value(r[0]) + r[2] * weight, r[0]))
        if inside:
            return min(inside, key=lambda r: (abs(self.value(r[0]) + r[2] * weight - self.band.avg), r[0]))
        return None if self._safety else fits[0]

    def _lighter_leases_suffice(self, donor: str, rate: float) -> bool:
        """Whether the donor's leases that each keep it above `low_landing` could together get it inside the band."""
        value, excess = self.value(donor), self.value(donor) - self.ceiling(donor)
        lowest = self.low_landing() if self.d.config.allow_throughput_overshoot else self.band.lower
        light = sum(weight for weight, _ in self._movable(donor) if value - rate * weight >= lowest)
        return rate * light >= excess

    def _push_one(self, donor: str) -> bool:
        """Hand a lease too heavy for anyone to a worker that can then shed enough lighter leases to stay in band.

        The last resort for a worker holding several hot shards: each is heavier than any other worker's room, so
        it moves only if its receiver can give away enough of its own lighter leases in the same run to get back to
        the average (and the lease cannot bounce back: balancing leaves it alone for a while).
        """
        d, metric, peak = self.d, self.metric, self.value(donor)
        # Only far above the band (half a band beyond its ceiling), not merely above an operating range inside it:
        # a push moves a heavy lease and several light ones, too much to fix a worker just over the edge.
        if peak <= self.band.upper or peak - self.ceiling(donor) < (self.band.upper - self.band.avg) / 2:
            return False
        receivers = []
        for wid in self._extremes(PROBES, True, donor):
            if not self._takes_part(wid):
                continue
            weights = [w for w, _ in self._movable(wid)]
            receivers.append((wid, d.rise(wid, metric, 1.0), d.drop_rate(wid, metric) or 0.0, weights,
                              list(itertools.accumulate(weights)), min(self.ceiling(wid), peak - self.min_gain)))
        donor_rate = d.drop_rate(donor, metric)
        room = max((self._max_weight(r[0]) for r in receivers), default=0.0)
        for key in self._shed_candidates(donor, math.inf):
            weight = d.ledger.weight[key]
            if donor_rate is not None and donor_rate * weight < self.min_gain:
                continue
            # Of the receivers that can shed enough lighter leases, the one that needs the fewest (largest first).
            best: tuple[int, int, str, float, float] | None = None
            for at, (receiver, per_kbps, rate, weights, totals, bound) in enumerate(receivers):
                landed = self.value(receiver) + per_kbps * weight  # projections are linear in the weight
                if landed <= bound or landed > d.limits[receiver][metric] or self._refused(key, receiver):
                    continue  # it fits (a plain move was refused for another reason), or it breaks the range
                lighter = bisect.bisect_left(weights, weight)
                if not lighter or rate * totals[lighter - 1] < landed - min(bound, self.band.avg):
                    continue
                # Only leases some other worker has room for count: the receiver's sheds go somewhere too.
                takeable = weights[:min(lighter, bisect.bisect_right(weights, room))]
                sheds = leases_to_cover([rate * w for w in takeable], landed - bound)
                if best is None or (sheds, at) < best[:2]:
                    best = (sheds, at, receiver, landed, bound)
            if best is None:
                continue
            _, _, receiver, landed, bound = best
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
        per_kbps, rate = d.rise(donor, metric, 1.0), d.drop_rate(donor, metric)
        if not self._takes_part(donor) or per_kbps <= 0 or rate is None:
            return False
        best: tuple[float, str, str, str] | None = None
        for receiver in self._extremes(PROBES, True, donor):
            returns, r_rate = self._movable(receiver), d.drop_rate(receiver, metric)
            if not self._takes_part(receiver) or not returns or r_rate is None:
                continue
            r_value, r_ceiling, r_per_kbps = self.value(receiver), self.ceiling(receiver), d.rise(receiver, metric, 1.0)
            for weight, key in self._movable(donor):
                given = value - rate * weight
                # Projections are linear in the weight: the return that would land the donor on its target, and its
                # neighbours by weight.
                ideal = (target - given) / per_kbps
                at = bisect.bisect_left(returns, (ideal, ""))
                for back_weight, back in returns[max(0, at - 2):at + 2]:
                    if back_weight >= weight or self._refused(key, receiver) or self._refused(back, donor):
                        continue
                    d_after = given + back_weight * per_kbps
                    r_after = r_value + r_per_kbps * weight - r_rate * back_weight
                    if not (self.band.lower <= d_after <= ceiling and r_after <= r_ceiling
                            and max(d_after, r_after) <= value - self.min_gain):
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
    def floor(self) -> float:
        """Below this a worker is far below the band (a new or long-idle worker) and is filled.

        A band's width under the average: lifting a worker just under the band would cost moves without lowering
        any peak.
        """
        floor = self.band.lower - (self.band.avg - self.band.lower) - self.margin()
        if self.d.count_only:  # idle stream: only a worker with less than half the average count (a new one)
            floor = min(floor, self.band.avg / 2)
        return floor

    def under(self) -> list[str]:
        """The workers far below the band (by value and by confirmed value), least loaded first."""
        floor = self.floor()
        return sorted((w for w in self.holders if max(self.value(w), self.confirmed(w)) < floor),
                      key=lambda w: (self.value(w), w))

    def fill(self) -> None:
        """Lift every worker far below the band into it, least loaded first, from the most loaded workers."""
        for receiver in self.under():
            for _ in range(MAX_MOVES_PER_WORKER):
                if self.value(receiver) >= self.band.lower:
                    break
                if not self._fill_one(receiver):
                    # Nothing the most loaded workers hold fits the least loaded receiver, so it fits none of the
                    # (fuller) receivers after it either.
                    return

    def _fill_one(self, receiver: str) -> bool:
        """The giver's lease that lands the receiver closest to the average (else lifts it most); False if none."""
        d, metric, avg = self.d, self.metric, self.band.avg
        per_kbps = d.rise(receiver, metric, 1.0)
        if per_kbps <= 0 or not self._takes_part(receiver):
            return False
        base = self.value(receiver)
        ideal = (avg - base) / per_kbps
        in_band = self._max_weight(receiver)  # what the receiver's bands and ranges allow, whoever gives
        lift: tuple[float, str, str] | None = None  # the biggest partial lift seen, if nothing lands
        for giver in self._extremes(PROBES, False, receiver):
            giver_value = self.value(giver)
            if giver_value <= avg:
                break
            rate = d.drop_rate(giver, metric) or 0.0
            most = min(in_band, (giver_value - base) / per_kbps)
            if rate:
                most = min(most, (giver_value - self.band.lower) / rate)
            movable = self._movable(giver)
            upto = bisect.bisect_right(movable, (most, "\uffff"))
            at = min(bisect.bisect_left(movable, (ideal, "")), upto)
            # Projections are linear: the receiver lands at base + weight x per_kbps. Prefer the lease nearest the
            # ideal weight that lands inside the band; else remember the heaviest that fits (the biggest lift).
            near = movable[max(0, at - 1):min(at + 1, upto)]
            if len(near) == 2 and abs(near[1][0] - ideal) < abs(near[0][0] - ideal):
                near.reverse()
            for weight, key in [*near, *movable[max(0, upto - 1):upto]]:
                landed = base + per_kbps * weight
                if (landed > giver_value - self.min_gain or not self._worth((rate + per_kbps) * weight)
                        or self._refused(key, receiver)):
                    continue
                if landed >= self.band.lower:
                    self._move(key, giver, receiver, landed, "below the band: fill")
                    return True
                if lift is None or landed > lift[0]:
                    lift = (landed, key, giver)
                break
        if lift is None:
            return False
        landed, key, giver = lift
        self._move(key, giver, receiver, landed, "below the band: fill")
        return True

    def outcome(self) -> Outcome:
        """The pass's result as `BandDecider` compares styles: who is still out of band, and any repeated donor."""
        floor = self.floor()
        outside = sum(1 for w in self.holders if self.value(w) > self.ceiling(w) or self.value(w) < floor)
        moves = [move for move in self.d.ledger.moves.values() if move.reason is self.reason]
        givers = [move.from_owner for move in moves]
        moved, closest = self._landing(moves)
        risk = sum(landing_risk(self.ceiling(w) - self.value(w), self.min_gain) for w in moved)
        return Outcome(outside, closest, len(givers) > len(set(givers)), self.min_gain, risk)


class ShareFill(BandBalancer):
    """Fill on the throughput share while every worker is inside the band of its reported metric.

    Only workers holding no lease are filled, and only if that metric does not call them busy (their confirmed value
    at most its average): where a worker holds leases and its metric puts it level with the others, the metric is
    what balancing trusts (it may carry little KiB/s and much work per record).
    """

    def under(self) -> list[str]:
        """The workers far below the throughput band that hold nothing and are not busy by their own metric."""
        d = self.d
        return [wid for wid in super().under() if not d.ledger.count(wid)
                and all(d.confirmed[wid][m] <= d.averages[m] for m in d.values[wid] if m != self.metric)]


def fill_on_share(fleet: FleetState, notes: list[str]) -> None:
    """With no metric out of band, fill a worker holding nothing (a new one) on throughput, up to the band.

    When the reported metric is mostly fixed overhead (agents' own CPU on a lightly loaded stream: 0.3 % for an agent
    holding nothing against 2.6-3.8 % for the others, with a band of +-4 points), it cannot tell an empty worker from
    a busy one, and a worker added to scale out would never get a lease. The throughput share can: a worker holding
    no lease, a band's width below the throughput band (31 % of a fair share on the local stack) in every report of
    the persistence window, and not busy by its metric, is filled into the band in one run, with the throughput
    metric's own minimum gain. Nothing is shed on throughput and no worker holding leases is filled, so a fleet whose
    figures are merely uneven keeps its assignment (decision 0014).
    """
    added = fleet.add_share() if fleet.config.rebalance_fill_on_throughput else []
    if not added:
        notes.append("balancing: no metric out of band")
        return
    share = THROUGHPUT_METRIC
    half = fleet.half_band(share)
    band = Band(share, fleet.averages[share], fleet.averages[share] - half, fleet.averages[share] + half)
    balancer = ShareFill(fleet, band)
    if balancer.under():
        notes.append(f"balancing: no metric out of band; filling on {share} (fill only): band [{band.lower:.2f}, "
                     f"{band.upper:.2f}], floor {balancer.floor():.2f}")
        balancer.fill()
    else:
        notes.append("balancing: no metric out of band")
    fleet.drop_share(added)


def balance_band(fleet: FleetState, notes: list[str], style: Style = USUAL) -> Outcome | None:
    """One band-balancing pass on the metric furthest out of band (else fill on throughput).

    It sheds, fills, and, if that moved leases, sheds the workers whose excess is not confirmed yet too.
    Returns what the pass left on the balanced metric (None if no metric was out of band).
    """
    if fleet.falling:
        notes.append("balancing: the fleet's throughput is falling fast; waiting for reports to catch up")
        return None
    band = metric_to_balance(fleet)
    if band is None:
        fill_on_share(fleet, notes)
        return None
    notes.append(f"balancing {band.metric} (band): avg {band.avg:.2f}, band [{band.lower:.2f}, {band.upper:.2f}]")
    balancer = BandBalancer(fleet, band, style)
    balancer.shed()
    balancer.fill()
    balancer.shed_unconfirmed()
    return balancer.outcome()

