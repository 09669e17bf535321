"""Strategy `variance`: KCL 3.x's utilisation-aware assignment (its variance decider), with its weak spots fixed.

Balancing comes in two modes (`variance_balancing`): `band` (default, coordinator/band_balance.py: every worker back
inside the band in one run with as few moves as the leases allow) and `kcl` (KCL's dampened donor budgets, below).
In both, each worker's reported value is caught up with the load its reports do not show yet (`_catch_up`, from the
throughput history the leader records at each report). In band mode the decider also fits `value = base + slope x
throughput` over the fleet (coordinator/load_model.py) to project moves, and its averages count the load of leases
that still need an owner.

Kept from KCL: EMA of each worker's metric history (alpha 0.5, -1 skipped); invalid and failing workers take no part;
workers without metrics get a synthetic throughput metric `T` (100 = an average share); priority assignment of
unassigned then longest-silent expired leases to the worker with most room; balancing on the metric with the largest
dampened budget, donors above the band or their operating range, the strict `remaining - x > 0` walk, overshoot with
the smallest lease, receivers never pushed past the fleet average or their operating range, `max_leases_for_worker`
and KCL's `max_throughput_per_host_kbps` check (before adding a lease).

Differences (each tested in tests/coordinator/test_variance.py, band mode in test_band_balance.py):
* Ties in the worker queue break on (room, fewer leases, worker id), so equal workers never ping-pong.
* A total throughput of 0 makes every lease weigh 1 (see `Ledger`), so idle streams balance lease counts instead of
  collapsing into NaN; the synthetic `T` value is projected exactly (`100 * x / T`), so a worker
  with zero throughput does not absorb every lease; a worker at 0 has infinite room (KCL: 1.0, ranked below busier
  workers); a donor at value 0 has no budget instead of dividing by zero.
* A receiver that would pass the average is put back and smaller leases (and further receivers) are tried; KCL ends
  the donor and drops the receiver for the rest of the run.
* A balancing move whose effect on the donor/receiver gap is below `rebalance_dead_band_percentage` of the average is
  not made (KCL issue #1814).
* A lease is moved at most once per run; donors' values drop in memory as leases leave, in proportion to
  the throughput they give away.
* Donor leases are walked largest first instead of in random order: deterministic, and the budget moves fewer leases.
* A donor above its operating range but below the average uses the operating range as its target, so its budget is
  positive; the fallback donor (trigger only from below) gives nothing if it is not above the average.
* An expired lease goes to a worker other than the one it expired under whenever another can take it (an owner that
  heartbeats but stopped renewing is stuck on that lease); only as a last resort is it re-assigned to its own owner (a
  plain assign restarting its failover period). KCL skips it, leaving it expired, unless it has a checkpoint owner.
* Draining workers receive nothing and all their leases move first (reason DRAIN, every run); the fleet average of a
  metric is the load of all workers spread over the non-draining ones, and `T` divides by non-draining workers.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from coordinator.band_balance import balance_band
from coordinator.decider_config import Balancing, DeciderConfig
from coordinator.ledger import Ledger, priority_reason
from coordinator.load_model import Line, fit_line, proportional
from coordinator.moves import MoveReason, Plan, Unplaced, UnplacedReason, WorkerStatus, WorkerSummary
from coordinator.snapshot import Snapshot, WorkerView
from shared.streams import stream_prefix
from shared.worker import FAILED_SAMPLE, THROUGHPUT_METRIC

# How many receivers a balancing move may try before giving up on a lease (bounds the cost of retrying).
RECEIVER_PROBES = 8
# A worker whose reports miss more than this share of its throughput change is "unsettled": its value is taken from
# the line for what it carries now instead of its lagging reports, and its point stays out of the fit (`_catch_up`).
UNSETTLED_SHARE = 0.4

HeapEntry = tuple[float, int, str]
# Multi-stream leases: a receiver whose room is at most this much below the best one's counts as just as good, and
# among those the one holding the fewest leases of the lease's stream takes it (a stream is not piled on one worker).
STREAM_SPREAD_ROOM = 0.1


def ema(values: Sequence[float], alpha: float) -> float:
    """KCL's moving average over a metric history, oldest first: first sample as is, -1 (failed) samples skipped."""
    result: float | None = None
    for value in values:
        if value == FAILED_SAMPLE:
            continue
        result = value if result is None else alpha * value + (1.0 - alpha) * result
    return 0.0 if result is None else result


def classify(worker: WorkerView) -> WorkerStatus:
    """Valid and reporting (ACTIVE), malformed metrics (INVALID_METRICS) or a last sample of -1 (FAILING_METRIC)."""
    if worker.uses_default_metric:
        return WorkerStatus.ACTIVE
    if not worker.metric_stats:
        return WorkerStatus.INVALID_METRICS
    for metric, history in worker.metric_stats.items():
        limit = worker.operating_range.get(metric)
        if not limit or not limit[0] > 0 or math.isinf(limit[0]):
            return WorkerStatus.INVALID_METRICS
        if any(not math.isfinite(v) or (v < 0 and v != FAILED_SAMPLE) for v in history):
            return WorkerStatus.INVALID_METRICS
    if any(history and history[-1] == FAILED_SAMPLE for history in worker.metric_stats.values()):
        return WorkerStatus.FAILING_METRIC
    return WorkerStatus.ACTIVE


def room(values: Mapping[str, float], averages: Mapping[str, float]) -> float:
    """KCL's room to grow: least `(avg - v) / v` over the worker's metrics; v = 0 gives +inf (0 if avg is 0 too)."""
    best = math.inf
    for metric, value in values.items():
        avg = averages[metric]
        if value > 0:
            best = min(best, (avg - value) / value)
        elif avg <= 0:
            best = min(best, 0.0)
    return best


class VarianceDecider:
    """One pass of the variance strategy over a snapshot; call `plan(balance)` once."""

    def __init__(self, snapshot: Snapshot, config: DeciderConfig) -> None:
        self.config = config
        self.ledger = ledger = Ledger(snapshot)
        self.status: dict[str, WorkerStatus] = {}
        self.draining: list[str] = []
        self.active: list[str] = []
        self.default: set[str] = set()
        self.stale = {worker.worker_id for worker in snapshot.workers if worker.stale}
        for worker in snapshot.workers:
            self.status[worker.worker_id] = classify(worker)
            if worker.draining:
                self.draining.append(worker.worker_id)
            elif self.status[worker.worker_id] is WorkerStatus.ACTIVE:
                self.active.append(worker.worker_id)
        n_leases = len(snapshot.leases)
        n_active = max(1, len(self.active))
        self.target_throughput = ledger.mean_weight * n_leases / n_active
        self.target_leases = max(1, n_leases // n_active)
        self.values: dict[str, dict[str, float]] = {}
        self.limits: dict[str, dict[str, float]] = {}
        lagged: dict[str, float] = {}  # throughput as the metric history saw it (its moving average)
        # With no throughput figure at all (idle stream, new application) no metric can be tied to a lease: band
        # balancing then spreads lease counts, through the throughput-share metric every lease weighing 1.
        self.count_only = count_only = config.balancing is Balancing.BAND and ledger.unit_weights
        for worker in snapshot.workers:
            wid = worker.worker_id
            if self.status[wid] is not WorkerStatus.ACTIVE:
                continue
            if worker.uses_default_metric or count_only:
                self.default.add(wid)
                share = ledger.throughput[wid] / self.target_throughput if self.target_throughput > 0 else 0.0
                self.values[wid] = {THROUGHPUT_METRIC: 100.0 * share}
                # KCL's operating range for the synthetic metric is 100 (the average share); band mode balances on
                # the band alone, or every worker above the average share would have to shed.
                self.limits[wid] = {THROUGHPUT_METRIC: math.inf if config.balancing is Balancing.BAND else 100.0}
            else:
                alpha = config.worker_metrics_ema_alpha
                self.values[wid] = {m: ema(h, alpha) for m, h in worker.metric_stats.items()}
                self.limits[wid] = {m: worker.operating_range[m][0] for m in worker.metric_stats}
                if worker.throughput_history:
                    lagged[wid] = ema(worker.throughput_history, alpha)
        self.before = {wid: dict(vals) for wid, vals in self.values.items()}
        # Every metric name any worker reports: averages and lines are defined over all of them (see `_averages`).
        self.metrics = sorted({metric for vals in self.values.values() for metric in vals})
        self.unsettled: set[str] = set()
        self.carried_throughput = self._carried_throughput()
        fleet_now = fleet_seen = 0.0
        for wid, seen in lagged.items():
            now = ledger.known_throughput(wid)
            fleet_now, fleet_seen = fleet_now + now, fleet_seen + seen
            if abs(now - seen) > UNSETTLED_SHARE * max(now, seen):
                self.unsettled.add(wid)
        # The whole fleet's throughput falling fast (a stream going quiet): workers whose reports show it already
        # look idle next to those whose reports do not yet, so balancing waits for the reports.
        self.falling = fleet_now < (1.0 - UNSETTLED_SHARE) * fleet_seen
        self.fitted = self._fit(lagged)
        self.lines = {**{m: line for m, line in snapshot.lines.items() if m not in self.fitted}, **self.fitted}
        self._catch_up(lagged)
        if config.balancing is Balancing.BAND:
            self.averages = self._band_averages()
        else:
            self.averages = self._averages()
            self.lines = {m: proportional(avg, self.carried_throughput) for m, avg in self.averages.items()}

    def _band_averages(self) -> dict[str, float]:
        """Band mode: each metric's average once every lease has an owner, from the non-draining workers' mean.

        The leases that still need an owner (unassigned, expired, on a draining worker) will add their projected
        load to the fleet; KCL instead counts draining workers' whole values (idle part included) and nothing for
        unowned leases, so its band sits too high while draining and too low after a crash.
        """
        means = self._averages(active_only=True)  # a metric only draining workers have: 0, as in KCL
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
        """The KiB/s a worker at the average value carries: KCL's `T`, or in band mode what reporting workers hold.

        `T` also counts unowned and expired leases, whose load no reported value shows yet, so after a crash it
        would understate how much each lease adds.
        """
        if self.config.balancing is not Balancing.BAND:
            return self.target_throughput
        reporting = {w for w in self.active if w not in self.default}
        ledger, carried = self.ledger, 0.0
        for key, owner in ledger.owner.items():
            if owner in reporting and not ledger.leases[key].needs_owner:
                carried += ledger.weight[key]
        return carried / len(reporting) if reporting and carried > 0 else self.target_throughput

    def _fit(self, lagged: Mapping[str, float]) -> dict[str, Line]:
        """Band mode: each metric's line fitted over (lagged throughput, value) of the settled reporting workers.

        An unsettled worker's report and its recorded throughput may come from different moments (a report that
        averages a period before and after a move), so its point would bend the line.
        """
        if self.config.balancing is not Balancing.BAND:
            return {}
        lines: dict[str, Line] = {}
        for metric, avg in self._averages(active_only=True).items():
            points = [(lagged.get(w, self.ledger.known_throughput(w)), self.values[w][metric]) for w in self.active
                      if w not in self.default and w not in self.unsettled and metric in self.values[w]]
            line = fit_line(points, avg)
            if line is not None:
                lines[metric] = line
        return lines

    def _catch_up(self, lagged: Mapping[str, float]) -> None:
        """Add to each reported value what its moving average has not seen yet of the worker's throughput change.

        The leader records the throughput a worker carried at each of its reports (`throughput_history`); the gap
        between the throughput it carries now (pending handoffs counted where they go) and the moving average of
        that history is load the reports do not show yet: a lease just moved, a shard that just turned hot. When the
        reports miss most of the change (an unsettled worker, e.g. right after a cold start), the line's value for
        the throughput it carries now replaces them.
        """
        if self.ledger.unit_weights:  # no throughput figures: nothing to compare with
            return
        band = self.config.balancing is Balancing.BAND
        slopes = {m: proportional(avg, self.carried_throughput).slope
                  for m, avg in self._averages(active_only=band).items()}
        slopes.update((m, line.slope) for m, line in self.lines.items())
        bases = {m: line.base for m, line in self.lines.items()}
        for wid, seen in lagged.items():
            now = self.ledger.known_throughput(wid)
            gap = now - seen
            if not gap:
                continue
            if wid in self.unsettled:  # reports too far behind: the line's value for what it carries now
                caught_up = {m: bases.get(m, 0.0) + slopes[m] * now for m in self.values[wid]}
            else:
                caught_up = {m: max(0.0, v + slopes[m] * gap) for m, v in self.values[wid].items()}
            if all(math.isfinite(v) for v in caught_up.values()):  # degenerate (subnormal) throughput: keep reports
                self.values[wid] = caught_up

    def _averages(self, active_only: bool = False) -> dict[str, float]:
        """Per metric: the load of every worker with it over the non-draining ones (KCL's fleet average).

        With `active_only`, draining workers' load is left out (band mode adds their leases' share instead).
        """
        # Every metric any worker reports gets an entry (0 when no non-draining worker reports it), so a lookup by a
        # worker's metric can never miss: a lone metric name on a draining worker is a normal state (rolling deploy).
        totals = dict.fromkeys(self.metrics, 0.0)
        receivers = dict.fromkeys(self.metrics, 0)
        for wid, vals in self.values.items():
            if active_only and wid in self.draining:
                continue
            for metric, value in vals.items():
                totals[metric] += value
        for wid in self.active:
            for metric in self.values[wid]:
                receivers[metric] += 1
        return {m: (totals[m] / receivers[m] if receivers[m] else 0.0) for m in self.metrics}

    # -- the worker queue ------------------------------------------------------------------------------------------

    def _entry(self, wid: str) -> HeapEntry:
        return (-room(self.values[wid], self.averages), self.ledger.live_count(wid), wid)

    def assignable(self, wid: str, stale_ok: bool = False) -> bool:
        """Whether the worker may take another lease: a fresh heartbeat (unless `stale_ok`), and the max settings."""
        cfg = self.config
        return (
            (stale_ok or wid not in self.stale)
            and self.ledger.throughput.get(wid, 0.0) <= cfg.max_throughput_per_host_kbps
            and self.ledger.live_count(wid) < cfg.max_leases_for_worker
        )

    def _queue(self, stale_ok: bool = False) -> list[HeapEntry]:
        heap = [self._entry(wid) for wid in self.active if self.assignable(wid, stale_ok)]
        heapq.heapify(heap)
        return heap

    def _requeue(self, heap: list[HeapEntry], wid: str) -> None:
        if self.assignable(wid):
            heapq.heappush(heap, self._entry(wid))

    # -- projections -----------------------------------------------------------------------------------------------

    def rise(self, wid: str, metric: str, weight: float) -> float:
        """How much `metric` of `wid` is expected to grow when it takes a lease of `weight` KiB/s."""
        if self.target_throughput <= 0:
            return (self.averages[metric] - self.lines[metric].base) / self.target_leases
        if wid in self.default:
            return 100.0 * weight / self.target_throughput
        return weight * self.lines[metric].slope

    def projected(self, wid: str, weight: float) -> dict[str, float]:
        """The worker's metric values after it takes a lease of `weight` KiB/s."""
        return {m: v + self.rise(wid, m, weight) for m, v in self.values[wid].items()}

    def _lease_load(self, wid: str, metric: str) -> float:
        """The part of the worker's value its leases account for (its value above the line's base)."""
        return max(0.0, self.values[wid][metric] - (0.0 if wid in self.default else self.lines[metric].base))

    def drop_rate(self, wid: str, metric: str) -> float | None:
        """How much `metric` of `wid` falls per KiB/s given away (its lease-driven load over what it carries)."""
        carried = self.ledger.throughput.get(wid, 0.0)
        return self._lease_load(wid, metric) / carried if carried > 0 else None

    def drop(self, wid: str, metric: str, key: str) -> float:
        """How much `metric` of `wid` falls when lease `key` leaves it: its share of the worker's lease-driven load."""
        rate = self.drop_rate(wid, metric)
        if rate is not None:
            return rate * self.ledger.weight[key]
        return self._lease_load(wid, metric) / max(1, self.ledger.count(wid))

    def apply(self, key: str, wid: str, reason: MoveReason, detail: str) -> None:
        """Move `key` to `wid` in memory: the giver's values drop, the receiver's rise by the projection."""
        source = self.ledger.owner[key]
        weight = self.ledger.weight[key]
        if source is not None and source in self.values:
            self.values[source] = {m: v - self.drop(source, m, key) for m, v in self.values[source].items()}
        self.values[wid] = self.projected(wid, weight)
        self.ledger.move(key, wid, reason, detail)

    # -- phases ----------------------------------------------------------------------------------------------------

    def _assign_priority(self, heap: list[HeapEntry]) -> None:
        """Unassigned and expired leases, oldest first, each to the worker with most room (no average check)."""
        for lease in self.ledger.priority_leases():
            if not heap:
                self._spill_reason(lease.key)
                continue
            chosen = heapq.heappop(heap)
            if lease.avoids(chosen[2]) and heap:
                chosen = heapq.heapreplace(heap, chosen)  # the next best worker; the avoided one goes back
            stream = stream_prefix(lease.key)
            if stream is not None:
                chosen = self._spread_stream(heap, chosen, stream, lease.avoids)
            neg_room, _, wid = chosen
            detail = f"most room {-neg_room:.3g}; silent {lease.silent_ms} ms"
            self.apply(lease.key, wid, priority_reason(lease), detail)
            self._requeue(heap, wid)

    def stream_counts(self, wid: str) -> Counter[str | None]:
        """How many leases of each stream (`stream_prefix` of the key; None for single-stream keys) `wid` holds."""
        return Counter(stream_prefix(key) for key in self.ledger.held_by.get(wid, {}))

    def _spread_stream(self, heap: list[HeapEntry], chosen: HeapEntry, stream: str,
                       avoids: Callable[[str], bool]) -> HeapEntry:
        """Among receivers about as roomy as `chosen`, the one holding the fewest leases of `stream`.

        The others go back into the heap. Only multi-stream leases come here; single-stream placement is unchanged.
        """
        candidates = [chosen]
        while heap and len(candidates) < RECEIVER_PROBES and -heap[0][0] >= -chosen[0] - STREAM_SPREAD_ROOM:
            candidates.append(heapq.heappop(heap))
        held = {entry[2]: self.stream_counts(entry[2])[stream] for entry in candidates}
        best = min(candidates, key=lambda entry: (avoids(entry[2]), held[entry[2]], entry))
        for entry in candidates:
            if entry is not best:
                heapq.heappush(heap, entry)
        return best

    def _spill_reason(self, key: str) -> None:
        lease = self.ledger.leases[key]
        if not self.active:
            self.ledger.spill(lease, UnplacedReason.NO_ACTIVE_WORKER, "no active, non-draining worker")
        else:
            self.ledger.spill(lease, UnplacedReason.NO_CAPACITY, "every worker at max leases or max throughput")

    def _drain(self, heap: list[HeapEntry]) -> None:
        """Every live lease of a draining worker to the worker with most room."""
        for key in self.ledger.drain_leases(self.draining):
            owner = self.ledger.owner[key]
            if not heap:
                reason = UnplacedReason.NO_ACTIVE_WORKER if not self.active else UnplacedReason.NO_CAPACITY
                self.ledger.held.append(Unplaced(key, owner, reason, "draining; no worker can take it"))
                continue
            neg_room, _, wid = heapq.heappop(heap)
            self.apply(key, wid, MoveReason.DRAIN, f"{owner} draining; most room {-neg_room:.3g}")
            self._requeue(heap, wid)

    def half_band(self, metric: str) -> float:
        """Half the width of the balanced band around the average: the threshold share, at least the absolute floors.

        The floors are `rebalance_min_band_points` and twice the absolute minimum gain (hysteresis): a worker that
        leaves the band can then shed a lease worth the gain and land inside, nearer the average, where the noise of
        the next figures does not push it out again. On a stream of a few KiB/s the band is wider than 10 %.

        When only lease counts are balanced (no throughput figures: an idle stream), at least one lease (at most a
        quarter of the average): an idle period should not reshuffle an assignment that suits the traffic coming
        back more than it must.
        """
        avg = self.averages[metric]
        half = max(avg * self.config.rebalance_threshold_percentage / 100.0, self.config.rebalance_min_band_points,
                   2.0 * self._gain_floor(metric))
        if self.count_only and self.ledger.leases:
            one_lease = avg * len(self.active) / len(self.ledger.leases)
            half = max(half, min(one_lease, avg / 4))
        return half

    def min_gain(self, metric: str) -> float:
        """How much a balancing move must lower the peak of the workers it involves, in the metric's units.

        The dead-band share of the average, and at least an absolute floor: `rebalance_min_gain_kbps` for the
        throughput-share metric (converted to its points), `rebalance_min_gain_points` for CPU and the other metrics.
        A move worth less than the noise of the figures would be undone by the next run's numbers.
        """
        relative = self.averages[metric] * self.config.rebalance_dead_band_percentage / 100.0
        return max(relative, self._gain_floor(metric))

    def _gain_floor(self, metric: str) -> float:
        """The absolute minimum gain in the metric's units (0 when only lease counts are balanced)."""
        cfg = self.config
        if self.count_only:
            return 0.0
        if metric == THROUGHPUT_METRIC:
            return 100.0 * cfg.rebalance_min_gain_kbps / self.target_throughput if self.target_throughput > 0 else 0.0
        return cfg.rebalance_min_gain_points

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
            vals = {wid: self.values[wid][metric] for wid in holders}
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

    def plan(self, balance: bool) -> Plan:
        """Priority assignment, then drain, then (on balancing runs) variance balancing."""
        notes: list[str] = []
        if self.ledger.unit_weights and self.ledger.leases:
            notes.append("total throughput is 0: every lease weighs 1, so balancing counts leases")
        heap = self._queue()
        # Unowned and expired leases go to a worker with a late heartbeat only if no worker has a fresh one (every
        # heartbeat delayed on a loaded host): an owner that may be slow beats none. Handoffs never go to one.
        self._assign_priority(heap if heap or not self.stale else self._queue(stale_ok=True))
        self._drain(heap)
        if balance and self.config.balancing is Balancing.BAND:
            balance_band(self, notes)
        elif balance:
            self._balance(notes)
        return Plan(
            strategy="variance",
            balanced=balance,
            moves=tuple(self.ledger.moves.values()),
            spillover=tuple(self.ledger.spillover),
            held=tuple(self.ledger.held),
            workers=tuple(self._summaries()),
            averages=dict(self.averages),
            notes=tuple(notes),
            fitted=dict(self.fitted),
        )

    def _summaries(self) -> list[WorkerSummary]:
        out = []
        for wid, status in self.status.items():
            shown = WorkerStatus.DRAINING if wid in self.draining else status
            before = {m: round(v, 6) for m, v in self.before.get(wid, {}).items()}
            after = {m: round(v, 6) for m, v in self.values.get(wid, {}).items()}
            out.append(self.ledger.summary(wid, shown, before, after))
        return out

