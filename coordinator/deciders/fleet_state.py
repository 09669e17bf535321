"""What the variance strategies share: an immutable `FleetView` of one snapshot and a small mutable `FleetPlan`.

`FleetView`, never changed after `__init__`: values caught up with load not yet reported, confirmed values, ranges,
lines, averages. `FleetPlan`, changed only by `move`: the ledger and projected values; it places and writes the `Plan`.

As KCL: EMA of each metric (-1 skipped); invalid and failing workers take no part; workers without metrics get a
throughput-share metric `T` (100 = an average share); unassigned then longest-silent expired leases go to the roomiest
worker; the max settings. Differences (docs/kcl-differences.md): ties break on (room, fewer leases, id); an idle
stream weighs every lease 1; an expired lease avoids its old owner and refusers where it can; drains first; lagging
values caught up (`_catch_up`); an excess counts only as far as recent reports agree (`_confirm`, decision 0013).

Own excess (band only, decision 0044): a worker's points no lease explains (a Spark driver's JVM) are taken out of its
values and range before the line is fitted. Invariants: learned only from its own reports where its throughput moved
and its value did not follow (`load_model.own_base`), never while its figures change nor from a report made while
they changed (`WorkerView.settled_reports`); kept by the leader (`Snapshot.own_excess`) and never lowered by a later
report, but counted only as far as the newest value shows it; under the minimum gain it is none.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import Counter
from collections.abc import Collection, Mapping, Sequence

from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.ledger import Ledger, priority_reason
from shardherd.coordinator.load_model import Line, fit_line, own_base, proportional
from shardherd.coordinator.moves import MoveReason, Plan, Unplaced, UnplacedReason
from shardherd.coordinator.snapshot import Snapshot, WorkerView
from shardherd.shared.streams import stream_prefix
from shardherd.shared.worker import FAILED_SAMPLE, THROUGHPUT_METRIC
from shardherd.shared.worker_metrics import WorkerStatus, classify, ema, room

UNSETTLED_SHARE = 0.4  # reports missing more of a throughput change: valued on the line, out of the fit
STEADY_SHARE = 0.2  # reports count for persistence only where the worker carried about what it carries now
OUTLIER_FROM = 5  # with this many values (average and reports) the one nearest the average is left out (0014)
STREAM_SPREAD_ROOM = 0.1  # multi-stream: receivers this close to the roomiest one; the fewest of the stream wins
PROBES = 8  # how many receivers (or givers) a lease is tried against: bounds the cost

HeapEntry = tuple[float, int, str]
Values = dict[str, dict[str, float]]
Kbps = dict[str, float]


def _less(values: Values, own: Values) -> Values:
    """`values` (per worker and metric) less each worker's `own` points: what its leases explain (and may take)."""
    return {w: {m: v - own[w].get(m, 0.0) for m, v in vals.items()} if w in own else vals
            for w, vals in values.items()}


class FleetView:
    """The fleet as one snapshot shows it, as `band` models it (kcl_variance.py `KclView`: as KCL); immutable."""

    counts_idle = True  # an idle stream (every lease weighs 1) is balanced on lease counts (`count_only`)

    def __init__(self, snapshot: Snapshot, config: DeciderConfig, ledger: Ledger) -> None:
        self.config = config
        balanced = self._roster(snapshot)
        self.n_leases = len(snapshot.leases)
        self.target_throughput = ledger.mean_weight * self.n_leases / max(1, len(self.active))
        self.count_only = self.counts_idle and ledger.unit_weights
        self.multi_stream = stream_prefix(next(iter(ledger.weight), "")) is not None
        self.default = frozenset(w.worker_id for w in balanced if w.uses_default_metric or self.count_only)
        reporting = [w for w in balanced if w.worker_id not in self.default]
        values, seen, now = self._reports(balanced, ledger)
        self.carried = self._carried_throughput(ledger, reporting)
        # KiB/s that needs an owner (summed in a fixed order: a set's order, so the sum's last bit, varies by process)
        self.orphaned = sum(ledger.throughput.get(w, 0.0) for w in sorted(self.draining)) + sum(
            ledger.weight[lease.key] for lease in ledger.needy if ledger.owner[lease.key] not in self.draining)
        self._model(snapshot, values, seen, now, reporting)
        self.averages = self._averages(self.values)
        self.confirmed = {w: dict(vals) for w, vals in self.values.items()}
        if config.rebalance_persistent_reports > 1:  # the band as the newest values place it decides who counts
            self._confirm(reporting, ledger)
            self.averages = self._averages(self._centres())

    def _roster(self, snapshot: Snapshot) -> list[WorkerView]:
        """Who reports valid metrics (returned), drains, may be dead; whose lease figures still change."""
        workers, leases = snapshot.workers, snapshot.leases
        self.status = {w.worker_id: classify(w) for w in workers}
        self.draining = frozenset(w.worker_id for w in workers if w.draining)
        balanced = [w for w in workers if self.status[w.worker_id] is WorkerStatus.ACTIVE]
        self.active = tuple(w.worker_id for w in balanced if not w.draining)
        self.stale = frozenset(w.worker_id for w in workers if w.stale)
        # Settling: its leases cannot be priced yet (a figure still changes); fresh: placed this term, not yet settled
        self.settling = frozenset(lease.actual_owner for lease in leases if lease.settling and lease.actual_owner)
        self.fresh = frozenset(lease.key for lease in leases if lease.fresh)
        return balanced

    def _reports(self, balanced: Sequence[WorkerView], ledger: Ledger) -> tuple[Values, Kbps, Kbps]:
        """Values and ranges as reported (default workers: their share), KiB/s `seen` and `now`; sets `unsettled`.

        `seen`: the KiB/s each reporting worker's reports saw (EMA of its throughput history; none: what it carries
        now); `now`: what a worker with a throughput history carries now.
        """
        values, seen, now, self.limits = Values(), Kbps(), Kbps(), Values()
        alpha = self.config.worker_metrics_ema_alpha
        for worker in balanced:
            wid = worker.worker_id
            if wid in self.default:  # (its share: what `rise` gives a lease of its KiB/s)
                values[wid] = {THROUGHPUT_METRIC: self.rise(wid, THROUGHPUT_METRIC, ledger.throughput[wid])}
                self.limits[wid] = {THROUGHPUT_METRIC: math.inf}
                continue
            values[wid] = {m: ema(h, alpha) for m, h in worker.metric_stats.items()}
            self.limits[wid] = {m: worker.operating_range[m][0] for m in worker.metric_stats}
            if worker.throughput_history:
                seen[wid] = ema(worker.throughput_history, alpha)
                now[wid] = ledger.known_throughput(wid)
            else:
                seen[wid] = ledger.known_throughput(wid)
        self.unsettled = frozenset(w for w, kbps in now.items()
                                   if abs(kbps - seen[w]) > UNSETTLED_SHARE * max(kbps, seen[w]))
        return values, seen, now

    def _carried_throughput(self, ledger: Ledger, reporting: Sequence[WorkerView]) -> float:
        """Band's proportional line's KiB/s: what reporting workers hold on average (none: KCL's `T`)."""
        ids = {w.worker_id for w in reporting}
        carried = sum(ledger.throughput.get(w.worker_id, 0.0) for w in reporting) - sum(  # (in order: see `orphaned`)
            ledger.weight[lease.key] for lease in ledger.needy if ledger.owner[lease.key] in ids)
        return carried / len(reporting) if carried > 0 else self.target_throughput  # (none reporting: 0 carried)

    def _model(self, snapshot: Snapshot, values: Values, seen: Kbps, now: Kbps,
               reporting: Sequence[WorkerView]) -> None:
        """Lines and values: the kept own excess out, lines fitted, values caught up, own excess learned and out."""
        kept = {w: {m: min(x, values[w][m]) for m, x in own.items() if m in values[w]}  # counted up to the value
                for w, own in snapshot.own_excess.items() if w in values}
        less = _less(values, kept)
        self._lines(snapshot, less, seen)
        caught = self._catch_up(less, seen, now)
        self._own_excess(snapshot, reporting, caught, kept, now)  # (counting leases: no worker reports, none learned)
        self.values = _less(caught, {w: {m: self.own.get(w, {}).get(m, 0.0) - kept.get(w, {}).get(m, 0.0)
                                         for m in caught[w]} for w in {*kept, *self.own}})
        self.limits = _less(self.limits, self.own)

    def _lines(self, snapshot: Snapshot, values: Values, seen: Kbps) -> None:
        """Sets each metric's line: fitted (`fitted`), else the leader's last, else the proportional one.

        Fitted over (KiB/s `seen`, value) of the settled active reporting workers; the proportional line: the
        reporting workers' mean value (draining ones included) over `carried` (`T`: 100 over the target KiB/s).
        """
        self.fitted: dict[str, Line] = {}
        settled = set(self.active) - self.default - self.unsettled
        self.lines = dict(snapshot.lines)
        for metric, mean in self._mean(values, self.active).items():
            points = [(seen[w], vals[metric]) for w, vals in values.items() if w in settled and metric in vals]
            line = fit_line(points, mean)
            if line is not None:
                self.fitted[metric] = self.lines[metric] = line
            elif metric == THROUGHPUT_METRIC:
                self.lines.setdefault(metric, proportional(100.0, self.target_throughput))
            elif metric not in self.lines:
                reported = [vals[metric] for vals in values.values() if metric in vals]
                self.lines[metric] = proportional(sum(reported) / len(reported), self.carried)

    def _own_excess(self, snapshot: Snapshot, reporting: Sequence[WorkerView], caught: Values, kept: Values,
                    now: Mapping[str, float]) -> None:
        """Sets `learned` (each worker's own excess per metric, `_learn`) and `own`, the part the newest value shows.

        A worker's base: its value caught up with the kept excess back in, less slope x the KiB/s it carries now; own
        excess is above the typical base, the median over the workers with a throughput history.
        """
        bases = {w: {m: v + kept.get(w, {}).get(m, 0.0) - self.lines[m].slope * now.get(w, 0.0)
                     for m, v in vals.items()} for w, vals in caught.items()}
        typical = {m: statistics.median(bs) for m in self.lines if (bs := [bases[w][m] for w in now if m in bases[w]])}
        self.learned: Values = {w.worker_id: mine for w in reporting
                                if (mine := self._learn(w, snapshot.own_excess.get(w.worker_id, {}), typical))}
        self.own: Values = {}
        for wid, mine in self.learned.items():
            for metric, learned in mine.items():
                if metric in typical and metric in bases[wid]:  # (typical: only where a line is)
                    extra = min(learned, bases[wid][metric] - typical[metric])
                    if extra >= self.config.rebalance_min_gain_points and math.isfinite(extra):
                        self.own.setdefault(wid, {})[metric] = extra

    def _learn(self, worker: WorkerView, kept: Mapping[str, float], typical: Mapping[str, float]) -> dict[str, float]:
        """The excess the leader kept, raised where the worker's own base (`own_base`) is above `typical`."""
        mine = dict(kept)
        if worker.worker_id in self.unsettled or worker.worker_id in self.settling:
            return mine
        settled = worker.settled_reports  # a report made while a figure changed shows CPU, not KiB/s
        for metric, history in worker.metric_stats.items():
            if metric not in typical:
                continue
            newest = history if settled is None else history[max(0, len(history) - settled):]
            base = own_base(worker.throughput_history, newest, self.lines[metric].slope)  # (paired from the newest)
            # Never lowered here (the newest value bounds what counts); under the minimum gain: noise.
            if base is not None and base - typical[metric] >= max(mine.get(metric, 0.0),
                                                                  self.config.rebalance_min_gain_points):
                mine[metric] = base - typical[metric]
        return mine

    def _mean(self, values: Values, summed: Collection[str]) -> dict[str, float]:
        """Per metric, the `summed` workers' values' sum over the non-draining workers reporting it."""
        receivers = Counter(m for w in self.active for m in values[w])
        return {m: sum(values[w][m] for w in summed if m in values[w]) / receivers[m] if receivers[m] else 0.0
                for m in sorted({m for vals in values.values() for m in vals})}

    def _catch_up(self, values: Values, seen: Kbps, now: Kbps) -> Values:
        """Each value plus what its EMA has not seen of the worker's throughput change (unsettled: the line's)."""
        caught = dict(values)
        for wid, kbps in now.items():
            gap = kbps - seen[wid]
            if not gap:
                continue  # no change: the value as reported
            new = ({m: self.lines[m].base + self.lines[m].slope * kbps for m in caught[wid]} if wid in self.unsettled
                   else {m: max(0.0, v + self.lines[m].slope * gap) for m, v in caught[wid].items()})
            if all(math.isfinite(v) for v in new.values()):
                caught[wid] = new
        return caught

    def _centres(self) -> Values:
        """Where a worker counts in the average: its value if on its confirmed side, else its confirmed value."""
        return {w: {m: v if self.side(m, v) == self.side(m, self.confirmed[w][m]) else self.confirmed[w][m]
                    for m, v in vals.items()} for w, vals in self.values.items()}

    def _averages(self, values: Values) -> dict[str, float]:
        """Each metric's average once every lease has an owner: the load of leases needing one counted in."""
        means = self._mean(values, self.active)
        share = self.orphaned / max(1, len(self.active))
        return {m: mean + x if math.isfinite(x := self.lines[m].slope * share) else mean for m, mean in means.items()}

    def _confirm(self, reporting: Sequence[WorkerView], ledger: Ledger) -> None:
        """A value outside the band counts as far from the average as its last reports (caught up) agree, if steady."""
        back = self.config.rebalance_persistent_reports
        noise = self.config.rebalance_min_gain_kbps  # a change under the minimum gain explains nothing (0042)
        for worker in reporting:
            wid, now = worker.worker_id, ledger.known_throughput(worker.worker_id)
            carried = worker.throughput_history[-back:]
            if len(carried) < back or any(abs(k - now) > max(STEADY_SHARE * max(k, now), noise) for k in carried):
                continue
            for metric, value in self.values[wid].items():
                history = worker.metric_stats[metric][-back:]
                if len(history) < back or FAILED_SAMPLE in history or not self.side(metric, value):
                    continue
                slope, own = self.lines[metric].slope, self.own.get(wid, {}).get(metric, 0.0)
                reports = [v + slope * (now - kbps) - own for v, kbps in zip(history, carried, strict=True)]
                ranked = sorted((value, *reports), key=lambda v: (abs(v - self.averages[metric]), v))
                self.confirmed[wid][metric] = ranked[1] if len(ranked) >= OUTLIER_FROM else ranked[0]

    def side(self, metric: str, value: float) -> int:
        """-1 below the band around the average, 1 above it, 0 inside (edges included)."""
        avg, half = self.averages[metric], self.half_band(metric)
        return -1 if value < avg - half else 1 if value > avg + half else 0

    def half_band(self, metric: str) -> float:
        """Half the band: the threshold share of the average, at least the floors (idle stream: about a lease)."""
        avg = self.averages[metric]
        half = max(avg * self.config.rebalance_threshold_percentage / 100.0, self.config.rebalance_min_band_points,
                   2.0 * self.gain_floor(metric))
        if self.count_only and self.n_leases:
            half = max(half, min(avg * len(self.active) / self.n_leases, avg / 4))
        return half

    def min_gain(self, metric: str) -> float:
        """How much a balancing move must separate giver and receiver: the dead-band share, at least the floor."""
        return max(self.averages[metric] * self.config.rebalance_dead_band_percentage / 100.0, self.gain_floor(metric))

    def gain_floor(self, metric: str) -> float:
        """The absolute minimum gain in the metric's units (`rebalance_min_gain_kbps` in share points for `T`)."""
        if self.count_only:
            return 0.0
        if metric == THROUGHPUT_METRIC:
            tp = self.target_throughput
            return 100.0 * self.config.rebalance_min_gain_kbps / tp if tp > 0 else 0.0
        return self.config.rebalance_min_gain_points

    def ceiling(self, wid: str, metric: str) -> float:
        """The highest value the worker may reach on `metric`: the band's upper edge or its operating range."""
        return min(self.averages[metric] + self.half_band(metric), self.limits[wid][metric])

    def rise(self, wid: str, metric: str, weight: float) -> float:
        """How much `metric` of `wid` grows when it takes a lease of `weight` KiB/s (the line's slope)."""
        if wid in self.default:  # (no lease at all: nothing moves, and a default worker's share stays 0)
            return 100.0 * weight / self.target_throughput if self.target_throughput > 0 else 0.0
        return weight * self.lines[metric].slope


class FleetPlan:
    """The mutable part of one pass: the ledger and each worker's projected values; changed only by `move`."""

    def __init__(self, view: FleetView, ledger: Ledger) -> None:
        self.view = view
        self.ledger = ledger
        self._values: Values = dict(view.values)  # (a move replaces a worker's values: the view's stay as they are)
        self.changed: set[str] = set()  # workers a move of this run gave or took a lease: their projection is known

    def values(self, wid: str) -> Mapping[str, float]:
        """The worker's projected values (per metric) after the moves so far."""
        return self._values[wid]

    def _load(self, wid: str, metric: str) -> float:
        """The part of the worker's projected value its leases explain (above the line's base)."""
        return max(0.0, self._values[wid][metric] - (0.0 if wid in self.view.default else self.view.lines[metric].base))

    def rate(self, wid: str, metric: str) -> float | None:
        """How much `metric` of `wid` falls per KiB/s it gives away (its lease-driven load over what it carries)."""
        carried = self.ledger.throughput.get(wid, 0.0)
        return self._load(wid, metric) / carried if carried > 0 else None

    def drop(self, wid: str, metric: str, key: str) -> float:
        """How much `metric` of `wid` falls when lease `key` leaves it (without KiB/s: an equal part per lease)."""
        rate = self.rate(wid, metric)
        return rate * self.ledger.weight[key] if rate is not None else self._load(wid, metric) / self.ledger.count(wid)

    def assignable(self, wid: str, stale_ok: bool = False) -> bool:
        """Whether the worker may take another lease: a fresh heartbeat (unless `stale_ok`) and the max settings."""
        cfg = self.view.config
        return ((stale_ok or wid not in self.view.stale)
                and self.ledger.throughput.get(wid, 0.0) <= cfg.max_throughput_per_host_kbps
                and self.ledger.live_count(wid) < cfg.max_leases_for_worker)

    def stream_counts(self, wid: str) -> Counter[str | None]:
        """How many leases of each stream (`stream_prefix`) `wid` holds; none counted in a single-stream application."""
        return Counter(map(stream_prefix, self.ledger.held_by.get(wid, ()))) if self.view.multi_stream else Counter()

    def move(self, key: str, wid: str, reason: MoveReason, detail: str) -> None:
        """Move `key` to `wid`: the giver's values drop by its own rate, the receiver's rise by the line."""
        source, weight = self.ledger.owner[key], self.ledger.weight[key]
        if source in self._values:  # (no owner, or one not balanced: no values to lower)
            self._values[source] = {m: v - self.drop(source, m, key) for m, v in self._values[source].items()}
        self._values[wid] = {m: v + self.view.rise(wid, m, weight) for m, v in self._values[wid].items()}
        self.ledger.move(key, wid, reason, detail)
        self.changed.update((wid,) if source is None else (source, wid))

    def queue(self, stale_ok: bool = False) -> list[HeapEntry]:
        """The receivers by most room (KCL's order; ties: fewer leases, worker id)."""
        heap: list[HeapEntry] = []
        for wid in self.view.active:
            self.requeue(heap, wid, stale_ok)
        return heap

    def requeue(self, heap: list[HeapEntry], wid: str, stale_ok: bool = False) -> None:
        """Put a worker into the queue (again after it took a lease) if it may take another."""
        if self.assignable(wid, stale_ok):
            heapq.heappush(heap, (-room(self._values[wid], self.view.averages), self.ledger.live_count(wid), wid))

    def place(self) -> None:
        """Unassigned, expired (oldest first), then draining leases to the roomiest worker (late heartbeats: last)."""
        heap = self.queue()
        priority = heap or self.queue(stale_ok=True)  # workers with a late heartbeat only where no other may take one
        none = UnplacedReason.NO_CAPACITY if self.view.active else UnplacedReason.NO_ACTIVE_WORKER
        for lease in self.ledger.priority_leases():
            if not self._place_one(priority, lease.key, priority_reason(lease), f"silent {lease.silent_ms} ms"):
                self.ledger.spill(lease, none, "no worker can take it")
        for key in self.ledger.drain_leases(self.view.draining):
            owner = self.ledger.owner[key]
            if not self._place_one(heap, key, MoveReason.DRAIN, f"{owner} draining"):
                self.ledger.held.append(Unplaced(key, owner, none, "draining; no worker can take it"))

    def _place_one(self, heap: list[HeapEntry], key: str, reason: MoveReason, why: str) -> bool:
        """Give the lease to the roomiest worker it does not avoid (of those about as roomy: fewest of its stream)."""
        if not heap:
            return False
        lease, stream = self.ledger.leases[key], stream_prefix(key)
        candidates = [heapq.heappop(heap)]
        while heap and len(candidates) < PROBES and (lease.avoids(candidates[0][2]) or (
                stream is not None and -heap[0][0] >= -candidates[0][0] - STREAM_SPREAD_ROOM)):
            candidates.append(heapq.heappop(heap))
        best = min(candidates, key=lambda e: (lease.avoids(e[2]), self.stream_counts(e[2])[stream] if stream else 0, e))
        candidates.remove(best)
        for entry in candidates:
            heapq.heappush(heap, entry)
        self.move(key, best[2], reason, f"most room {-best[0]:.3g}; {why}")
        self.requeue(heap, best[2], stale_ok=True)  # (it came from this queue, which judged its heartbeat already)
        return True

    def result(self, strategy: str, balanced: bool, notes: Sequence[str]) -> Plan:
        """The plan: moves in the order chosen, what found no worker, per-worker summaries, averages, notes."""
        ledger, view = self.ledger, self.view
        summaries = []
        for wid, status in view.status.items():
            shown, own = WorkerStatus.DRAINING if wid in view.draining else status, view.own.get(wid, {})
            before = {m: round(v + own.get(m, 0.0), 6) for m, v in view.values.get(wid, {}).items()}
            after = {m: round(v + own.get(m, 0.0), 6) for m, v in self._values.get(wid, {}).items()}
            summaries.append(ledger.summary(wid, shown, before, after))
        prefix = ("total throughput is 0: every lease weighs 1, so balancing counts leases",) if (
            ledger.unit_weights and ledger.leases) else ()
        return Plan(strategy=strategy, balanced=balanced, moves=tuple(ledger.moves.values()),
                    spillover=tuple(ledger.spillover), held=tuple(ledger.held), workers=tuple(summaries),
                    averages=dict(view.averages), notes=(*prefix, *notes), fitted=dict(view.fitted),
                    own_excess=view.learned)
