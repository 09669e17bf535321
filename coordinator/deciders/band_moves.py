"""Strategy `band`'s balancing pass on one metric (band.py chooses the metric).

Invariants (checked after every move by tests/coordinator/test_decider_properties.py):
1. A move goes to a receiver with a fresh heartbeat, under `max_leases_for_worker` and `max_throughput_per_host_kbps`,
   that never gave the lease back, from a giver with a fresh heartbeat whose lease figures are settled (a fill on
   shares may move fresh leases, placed in this term and never settled: moving one costs nothing measurable);
   only leases balancing did not move in this run or the last few runs move (one placed in this run may move on once).
2. The receiver ends at or below its ceiling on every metric it reports (the band's edge or its operating range; a
   split of heavy leases, 3: its operating range) and at least the minimum gain below the giver's value before the
   move: the next run cannot move the lease back.
3. A donor is above its ceiling, as its reports confirm unless a move of this run changed it or this pass moved any
   lease; it sheds while above, each move lowering it, landing it no lower than the minimum gain above the fill floor.
   Its ceiling is the band's edge or its operating range, whichever is lower: one heavy lease never lets it keep the
   others (as KCL). Under its operating range it never gives a lease the fill on shares would give back
   (`_unrefilled`, decision 0044). A donor holding two or more leases too heavy for the band (each rises a worker more
   than the band's width and more than any receiver takes under its ceiling; leases weighed by KiB/s) first hands the
   lightest of them to the least loaded receiver, which may end above the band's edge but not above its operating range
   nor the giver's value less the minimum gain (`_split`, decision 0046); the receiver then sheds as a donor.
4. A worker far below the band (value and confirmed value a band's width under it) is filled, least loaded first,
   from the most loaded workers above the average, none ending below the band nor giving a lease the fill on shares
   would give back (as invariant 3); a lift is at least the minimum gain.
5. Shed and fill repeat until a round moves nothing: the same pass on the same reports leaves the plan alone.

A donor's preference (`_preferred`): the lease landing it inside the band nearest the average, else least far under it,
else its heaviest that keeps it above; each to the least loaded of PROBES receivers that takes it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from typing import NamedTuple

from shardherd.coordinator.deciders.fleet_state import PROBES, FleetPlan, FleetView
from shardherd.coordinator.moves import MoveReason
from shardherd.shared.streams import stream_prefix
from shardherd.shared.worker import THROUGHPUT_METRIC

ROUNDING = 1e-9  # relative slack on the band's edges: a value computed to sit on an edge counts as inside
SHARE_FILL_BELOW = 50.0  # a worker is filled on shares only below this share of an average worker's KiB/s


def share_band(view: FleetView) -> tuple[Band, bool] | None:
    """The fill on shares' band (band.py `balance_pass`) and whether it counts leases; None where it does not run.

    It counts leases where an empty worker is inside the throughput band's floor (KiB/s within the noise, 0042).
    """
    cfg = view.config
    if not cfg.rebalance_fill_on_throughput or view.target_throughput <= 0 or THROUGHPUT_METRIC in view.averages:
        return None  # (`T`: a worker without metrics, or every worker of an idle stream, is balanced on its share)
    floors = (cfg.rebalance_threshold_percentage, cfg.rebalance_min_band_points)
    dead = cfg.rebalance_dead_band_percentage
    gain = view.gain_floor(THROUGHPUT_METRIC)  # as `FleetView.min_gain`, the average being 100
    band = Band.around(THROUGHPUT_METRIC, 100.0, max(*floors, 2.0 * gain), max(gain, dead), dead, SHARE_FILL_BELOW)
    if band.floor > 0:
        return band, False
    one = 100.0 * len(view.active) / view.n_leases  # one lease, in points of the average count
    return Band.around(THROUGHPUT_METRIC, 100.0, max(*floors, min(one, 25.0)), one, dead, SHARE_FILL_BELOW), True


def joiner_ceiling(view: FleetView, wid: str, metric: str, value: float, carried: float) -> float:
    """A joining worker's ceiling: the band's edge raised by its own load over the fleet's base, within its range.

    A Spark driver's JVM sits above the base; leases did not put it there (issue 33: such a worker was never filled).
    """
    edge = view.ceiling(wid, metric)
    excess = value - view.rise(wid, metric, carried) - view.lines[metric].base
    return max(edge, min(edge + excess, view.limits[wid][metric]))


class Band(NamedTuple):
    """The balanced band of one metric: average, edges, the fill floor and the minimum gain of a move."""

    metric: str
    avg: float
    lower: float
    upper: float
    floor: float
    min_gain: float

    @classmethod
    def around(cls, metric: str, avg: float, half: float, min_gain: float, dead_band: float,
               floor_cap: float = math.inf) -> Band:
        """The band avg +- half; the floor a band's width and the dead-band share under its lower edge (capped)."""
        slack = ROUNDING * max(1.0, abs(avg))
        lower, upper = avg - half - slack, avg + half + slack
        return cls(metric, avg, lower, upper, min(floor_cap, lower - half - avg * dead_band / 100.0), min_gain)


class BandPass:
    """Shed and fill on one metric over a plan; `run()` once. Reads the plan only through its public methods."""

    on_shares = False  # a fill on shares (band.py `ShareFill`)

    def __init__(self, plan: FleetPlan, band: Band, counts_leases: bool = False,
                 shares: tuple[Band, bool] | None = None) -> None:
        self.plan = plan
        self.view = plan.view
        self.band = band
        self.metric = band.metric
        self.holders = [w for w in self.view.active if self.on_shares or self.metric in plan.values(w)]
        self.moved = 0
        self.counts_leases = counts_leases  # the measure: lease counts (every lease weighs 1) or KiB/s
        self._kbps = plan.ledger.weight  # each lease's KiB/s, and its weight on the measure
        self._weight = dict.fromkeys(self._kbps, 1.0) if counts_leases else self._kbps
        self._by_weight: dict[str, list[tuple[float, str]]] = {}  # movable leases by weight (dropped on a move)
        self._shares = shares  # `share_band`: a shed stops where the fill on shares would give leases back
        self._band_text = f"band [{band.lower:.2f}, {band.upper:.2f}] avg {band.avg:.2f}; {band.metric}"  # (in details)
        self._per_worker = self.view.n_leases / max(1, len(self.view.active))  # the average lease count
        self._at = {w: self.level(w) for w in self.holders}  # each holder's level (updated on a move)
        self._ranked = sorted((v, w) for w, v in self._at.items())  # the holders by level (kept sorted on a move)
        # Each holder's ceiling, the highest value it may keep (invariant 3): the band's edge or its operating range
        self._ceiling = {w: min(band.upper, self.view.limits[w].get(self.metric, math.inf)) for w in self.holders}
        self._top_limit = max(self._ceiling.values(), default=-math.inf)
        rises = (self.rise(w, 1.0) for w in self.holders)  # each holder's rise per KiB/s
        self._top_per_point = max((1.0 / r if r > 0 else math.inf for r in rises), default=0.0)  # most KiB/s per point

    def level(self, wid: str) -> float:
        """The worker's projected value of the balanced metric."""
        return self.plan.values(wid)[self.metric]

    def confirmed(self, wid: str) -> float:
        """The worker's value as far from the average as its last reports agree (its projection once it moved)."""
        return self.level(wid) if self.on_shares or wid in self.plan.changed else self.view.confirmed[wid][self.metric]

    def rise(self, wid: str, weight: float) -> float:
        """How much the balanced metric of `wid` rises with a lease of `weight` KiB/s."""
        return self.view.rise(wid, self.metric, weight)

    def fall(self, wid: str, key: str) -> float:
        """How much the balanced metric of `wid` falls when `key` leaves it."""
        return self.plan.drop(wid, self.metric, key)

    def room_left(self, wid: str, weight: float) -> bool:
        """Whether every other metric of the receiver stays under its ceiling with the lease."""
        return all(value + self.view.rise(wid, m, weight) <= self.view.ceiling(wid, m) + ROUNDING * max(1.0, value)
                   for m, value in self.plan.values(wid).items() if m != self.metric)

    def run(self) -> int:
        """Shed and fill until a round moves nothing (invariant 5); how many leases moved."""
        before = -1
        while self.moved > before:
            before = self.moved
            self.shed()
            self.fill()
        return self.moved

    def _unrefilled(self, donor: str, key: str) -> bool:
        """Whether the fill on shares leaves `key` off the donor once a shed or fill gave it (invariants 3 and 4).

        It gives it back where the donor, under its operating range, is without it a joiner under the fill's floor with
        room for the lease under its `joiner_ceiling`, which counts its value above the line as its own (the shed: as
        its leases').
        """
        ledger, shares = self.plan.ledger, self._shares
        kept, weight = ledger.count(donor) - 1, self._kbps[key]  # (the shed moves leases: read per lease)
        if shares is None or 2 * kept > self._per_worker or self._at[donor] > self.view.limits[donor][self.metric]:
            return True  # no fill on shares, not a joiner once it gave the lease, or above its operating range
        band, counts = shares
        left = ledger.throughput[donor] - weight
        share = 100.0 * (kept / self._per_worker if counts else left / self.view.target_throughput)
        value, rise = self._at[donor] - self.fall(donor, key), self.view.rise(donor, self.metric, weight)
        return share >= band.floor or value + rise > joiner_ceiling(self.view, donor, self.metric, value, left)

    def shed(self) -> None:
        """Every donor, most excess first, sheds while it is above its ceiling and a move helps."""
        donors = sorted((w for w in self.holders if self._at[w] > self._ceiling[w] and (
            self.moved or self.confirmed(w) > self._ceiling[w])), key=lambda w: (self._ceiling[w] - self._at[w], w))
        for donor in donors:
            while self._at[donor] > self._ceiling[donor] and self._shed_one(donor):
                pass

    def _movable(self, wid: str) -> list[tuple[float, str]]:
        """The leases balancing may move off `wid`, by weight (invariant 1; on shares a settling one's fresh leases)."""
        movable = self._by_weight.get(wid)
        if movable is None:
            view, keys = self.view, self.plan.ledger.movable(wid, True)
            if wid in view.stale or wid in view.settling:
                keys = [k for k in keys if k in view.fresh] if self.on_shares and wid not in view.stale else []
            movable = self._by_weight[wid] = sorted((self._weight[key], key) for key in keys)
        return movable

    def _extremes(self, lowest: bool, exclude: str) -> list[str]:
        """Up to PROBES of the least (or most) loaded holders other than `exclude`, least (most) loaded first."""
        ends = self._ranked[:PROBES + 1] if lowest else self._ranked[:-PROBES - 2:-1]
        return [wid for _, wid in ends if wid != exclude][:PROBES]

    def _taker(self, key: str, weight: float, receivers: list[str], cap: float,
               split: bool = False) -> tuple[str, float] | None:
        """The first of `receivers` taking the lease under `cap` and its ceiling (a split: its range); its value."""
        for receiver in receivers:
            landed = self._at[receiver] + self.rise(receiver, weight)
            limit = self.view.limits[receiver][self.metric] if split else self._ceiling[receiver]
            if (landed <= limit and landed <= cap and self.plan.assignable(receiver) and not
                    self.plan.ledger.leases[key].avoids(receiver) and self.room_left(receiver, self._kbps[key])):
                return receiver, landed
        return None

    def _shed_one(self, donor: str) -> bool:
        """The donor's split, else its cheapest steps out of excess (a batch while it stays above); True if moved."""
        value, rate = self._at[donor], self.plan.rate(donor, self.metric)
        ceiling, probes = self._ceiling[donor], self._extremes(True, donor)
        if not probes:
            return False
        cap, moved = value - self.band.min_gain, False
        fits = (min(cap, self._top_limit) - self._at[probes[0]]) * self._top_per_point  # most KiB/s a probe takes
        if self._split(donor, value, probes, fits):
            return True
        keys = self._preferred(donor, value, ceiling, fits * (1 + ROUNDING), rate)
        keys = self._spread(donor, keys) if self.view.multi_stream else keys
        for key in filter(lambda key: self._unrefilled(donor, key), keys):  # (lazy: judged as the donor gives)
            weight = self._weight[key]
            after = value - (rate * weight if rate is not None else self.fall(donor, key))
            if (moved and after <= ceiling) or not self._at[probes[0]] < min(cap, self._top_limit):
                return moved  # the next step is priced anew, or no receiver is below its limit and `cap`
            if after < value and (taker := self._taker(key, weight, probes, cap)) is not None:
                self._move(key, (donor, after), taker, "above the band: shed")
                if rate is None or after <= ceiling:  # (else its rate and ceiling stay)
                    return True
                value, moved = self._at[donor], True
                cap, probes = value - self.band.min_gain, self._extremes(True, donor)
        return moved

    def _split(self, donor: str, value: float, probes: list[str], fits: float) -> bool:
        """Hand the lightest of two or more leases too heavy for the band to the least loaded taker (invariant 3)."""
        per_kbps = self.rise(donor, 1.0)
        if self.view.count_only or per_kbps <= 0:
            return False
        movable = self._movable(donor)
        heavy = max((self.band.upper - self.band.lower) / per_kbps, fits)  # (in KiB/s: more than both is too heavy)
        first = bisect.bisect_right(movable, (heavy, "\uffff"))
        if len(movable) - first < 2:
            return False
        weight, key = movable[first]
        taker = self._taker(key, weight, probes, value - self.band.min_gain, True)
        if taker is not None:
            self._move(key, (donor, value - self.fall(donor, key)), taker, "above the band: split heavy leases")
        return taker is not None

    def _spread(self, donor: str, keys: Iterator[str]) -> Iterator[str]:
        """`keys`, equal weights together and among them the donor's most-held stream first: spreads each stream."""
        ordered, weight, held = list(keys), self.plan.ledger.weight, self.plan.stream_counts(donor)
        first: dict[float, int] = {}
        for at, key in enumerate(ordered):
            first.setdefault(weight[key], at)
        return iter(sorted(ordered, key=lambda k: (first[weight[k]], -held[stream_prefix(k)])))

    def _preferred(self, donor: str, value: float, ceiling: float, heaviest: float,
                   rate: float | None) -> Iterator[str]:
        """The donor's leases up to `heaviest` KiB/s (what any receiver could take), in its preference."""
        movable, band = self._movable(donor), self.band
        first = end = below = cap = bisect.bisect_right(movable, (heaviest, "\uffff"))
        if rate:
            first = min(cap, bisect.bisect_left(movable, ((value - ceiling) / rate, "")))  # at or under its ceiling
            end = min(cap, bisect.bisect_right(movable, ((value - band.lower) / rate, "\uffff")))  # inside the band
            low = band.floor + band.min_gain if self.view.config.allow_throughput_overshoot else band.lower
            below = min(cap, bisect.bisect_right(movable, ((value - low) / rate, "\uffff")))  # no lower than `low`
            ideal = (value - min(band.avg, ceiling - (band.upper - band.avg) / 2)) / rate  # lands it on the target
            # Inside the band: nearest the ideal weight first (a tie: the lighter; equal weights: outwards).
            yield from (movable[i][1] for i in sorted(range(first, end), key=lambda i: (
                abs(movable[i][0] - ideal), movable[i][0], i if movable[i][0] >= ideal else -i)))
        yield from (key for _, key in movable[end:below])
        yield from (key for _, key in reversed(movable[max(end, below):first]))
        yield from (key for _, key in reversed(movable[:min(first, end)]))

    def fill(self) -> None:
        """Lift every worker far below the band into it, least loaded first (invariant 4)."""
        joiners_only = self._per_worker / 2 if self.on_shares else math.inf  # (a lease count)
        under = sorted((w for w in self.holders if max(self._at[w], self.confirmed(w)) < self.band.floor
                        and self.plan.ledger.count(w) <= joiners_only), key=lambda w: (self._at[w], w))
        for receiver in under:
            start = self._at[receiver]
            while self._at[receiver] < self.band.lower and self.plan.assignable(receiver) and self._fill_one(receiver):
                pass
            if self._at[receiver] == start and self.plan.assignable(receiver):
                return  # nothing fits the least loaded receiver that may take a lease: nor the fuller ones

    def _fill_one(self, receiver: str) -> bool:
        """The lease landing the receiver nearest the average, from the PROBES most loaded givers; False if none.

        The band is symmetric: a lease landing inside is nearer than any below, which lifts it most among them.
        """
        band, base = self.band, self._at[receiver]
        mine = self.plan.stream_counts(receiver)  # among equal fills, the lease of a stream the receiver lacks most
        fills: list[tuple[float, int, float, str, str, float]] = []  # (distance, stream, landed, key, giver, after)
        for giver in self._extremes(False, receiver):
            value = self._at[giver]
            if value <= band.avg:
                break
            theirs = self.plan.stream_counts(giver)
            for weight, key in self._movable(giver):
                after = value - self.fall(giver, key)
                if band.lower <= after < value and self._unrefilled(giver, key) and (taker := self._taker(
                        key, weight, [receiver], value - band.min_gain)) and taker[1] >= base + band.min_gain:
                    stream = stream_prefix(key)
                    fills.append((abs(taker[1] - band.avg), mine[stream] - theirs[stream], taker[1], key, giver, after))
        if not fills:
            return False
        _, _, landed, key, giver, after = min(fills)
        self._move(key, (giver, after), (receiver, landed), "below the band: fill")
        return True

    def _move(self, key: str, giving: tuple[str, float], taking: tuple[str, float], why: str) -> None:
        """Move `key` from the giver to the receiver (each with its level after the move); update the indexes."""
        (giver, after), (receiver, landed), at = giving, taking, self._at
        detail = (f"{why}; {self._band_text} {giver} {at[giver]:.2f} -> {after:.2f}, "
                  f"{receiver} {at[receiver]:.2f} -> {landed:.2f}")
        self.plan.move(key, receiver, MoveReason.for_metric(self.metric), detail)
        self.moved += 1
        movable = self._by_weight[giver]  # the lease leaves the giver's list (it came from there) and joins nobody's
        del movable[bisect.bisect_left(movable, (self._weight[key], key))]
        for wid in (giver, receiver):
            del self._ranked[bisect.bisect_left(self._ranked, (at[wid], wid))]
            at[wid] = level = self.level(wid)
            bisect.insort(self._ranked, (level, wid))
