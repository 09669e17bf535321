"""The fleet as the two variance strategies see it: metric values, projections, placement of leases that must move.

`FleetState` is what strategies `band` (coordinator/deciders/band.py) and `kcl-variance`
(coordinator/deciders/kcl_variance.py) share: each worker's reported value caught up with the load its reports do not
show yet (`_catch_up`, from the throughput history the leader records at each report), the worker queue by room,
priority assignment of unassigned then longest-silent expired leases, the drain of draining workers, and the in-memory
projection of every move. Each strategy is a subclass that supplies its load model (how a lease's KiB/s turns into
metric points, and the averages it balances around) and its balancing phase. Pure: snapshot in, plan out.

Kept from KCL: EMA of each worker's metric history (alpha 0.5, -1 skipped); invalid and failing workers take no part;
workers without metrics get a synthetic throughput metric `T` (100 = an average share); priority assignment of
unassigned then longest-silent expired leases to the worker with most room; `max_leases_for_worker` and KCL's
`max_throughput_per_host_kbps` check (before adding a lease).

Differences (tested in tests/coordinator/test_variance.py and test_band_balance.py):
* Ties in the worker queue break on (room, fewer leases, worker id), so equal workers never ping-pong.
* A total throughput of 0 makes every lease weigh 1 (see `Ledger`), so idle streams balance lease counts instead of
  collapsing into NaN; the synthetic `T` value is projected exactly (`100 * x / T`), so a worker
  with zero throughput does not absorb every lease; a worker at 0 has infinite room (KCL: 1.0, ranked below busier
  workers).
* An expired lease goes to a worker other than the one it expired under whenever another can take it (an owner that
  heartbeats but stopped renewing is stuck on that lease); only as a last resort is it re-assigned to its own owner (a
  plain assign restarting its failover period). KCL skips it, leaving it expired, unless it has a checkpoint owner.
* Draining workers receive nothing and all their leases move first (reason DRAIN, every run); the fleet average of a
  metric is the load of all workers spread over the non-draining ones, and `T` divides by non-draining workers.
* A lease is moved at most once per run; givers' values drop in memory as leases leave, in proportion to the
  throughput they give away.
"""

from __future__ import annotations

import abc
import heapq
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.ledger import Ledger, priority_reason
from shardherd.coordinator.load_model import Line, proportional
from shardherd.coordinator.moves import MoveReason, Plan, Unplaced, UnplacedReason, WorkerSummary
from shardherd.coordinator.snapshot import LeaseView, Snapshot
from shardherd.shared.streams import stream_prefix
from shardherd.shared.worker import FAILED_SAMPLE, THROUGHPUT_METRIC
from shardherd.shared.worker_metrics import WorkerStatus, classify, ema, room

# How many receivers a placement may try before giving up on a lease (bounds the cost of retrying).
RECEIVER_PROBES = 8
# A worker whose reports miss more than this share of its throughput change is "unsettled": its value is taken from
# the line for what it carries now instead of its lagging reports, and its point stays out of the fit (`_catch_up`).
UNSETTLED_SHARE = 0.4

# A worker whose throughput stayed within this share of what it carries now over its last reports held steady: a
# CPU excess there is no load change the catch-up explains, so it must persist before balancing acts (`_confirm`).
STEADY_SHARE = 0.2
# From this many values (a moving average and its reports), an excess is confirmed if all but one of them show it.
OUTLIER_FROM = 5
# A metric's newest report at or above this (a percentage of the host) is saturated: the reports cannot show how far
# the load goes beyond it (`_uncensor`), and its point stays out of the fit.
SATURATED = 99.0

HeapEntry = tuple[float, int, str]
# Multi-stream leases: a receiver whose room is at most this much below the best one's counts as just as good, and
# among those the one holding the fewest leases of the lease's stream takes it (a stream is not piled on one worker).
STREAM_SPREAD_ROOM = 0.1


class FleetState(abc.ABC):
    """One pass of a variance strategy over a snapshot; a subclass gives the load model and balancing phase.

    Build it once per snapshot and call `plan(balance)` once.
    """

    #: The name the plan reports (the strategy's name in `DeciderConfig`).
    strategy: str
    #: The operating range of the synthetic throughput-share metric `T` (KCL: 100, the average share).
    share_limit: float

    def __init__(self, snapshot: Snapshot, config: DeciderConfig) -> None:
        self.config = config
        self.ledger = ledger = Ledger(snapshot)
        self.status: dict[str, WorkerStatus] = {}
        self.draining: list[str] = []
        self.active: list[str] = []
        self.default: set[str] = set()
        self.stale = {worker.worker_id for worker in snapshot.workers if worker.stale}
        # Workers holding a lease whose figure is still changing: their load cannot be priced yet (band balancing).
        self.settling = {lease.actual_owner for lease in snapshot.leases if lease.settling and lease.actual_owner}
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
        self._values_before: dict[str, dict[str, dict[str, float]]] = {}  # per moved lease, for `take_back`
        self.limits: dict[str, dict[str, float]] = {}
        self.saturated: dict[str, set[str]] = {}  # per reporting worker, its metrics whose newest report is saturated
        lagged: dict[str, float] = {}  # throughput as the metric history saw it (its moving average)
        # Each of the last `rebalance_persistent_reports` reports on its own, with the throughput carried during it
        # (none when only the newest counts, as in KCL): see `_confirm`.
        persistent = config.rebalance_persistent_reports
        reports: list[tuple[dict[str, dict[str, float]], dict[str, float]]] = [
            ({}, {}) for _ in range(persistent if persistent > 1 else 0)]
        self.count_only = count_only = self._counts_only()
        # Per reporting worker, the KiB/s it carried at each report within the persistence window (`add_share`).
        self.carried_history: dict[str, tuple[float, ...]] = {}
        self._share_average: float | None = None  # the average of `T` before `add_share` set it
        for worker in snapshot.workers:
            wid = worker.worker_id
            if self.status[wid] is not WorkerStatus.ACTIVE:
                continue
            if worker.uses_default_metric or count_only:
                self.default.add(wid)
                share = ledger.throughput[wid] / self.target_throughput if self.target_throughput > 0 else 0.0
                self.values[wid] = {THROUGHPUT_METRIC: 100.0 * share}
                self.limits[wid] = {THROUGHPUT_METRIC: self.share_limit}
            else:
                alpha = config.worker_metrics_ema_alpha
                self.values[wid] = {m: ema(h, alpha) for m, h in worker.metric_stats.items()}
                self.limits[wid] = {m: worker.operating_range[m][0] for m in worker.metric_stats}
                self.saturated[wid] = {m for m, h in worker.metric_stats.items() if _newest(h) >= SATURATED}
                if worker.throughput_history:
                    lagged[wid] = ema(worker.throughput_history, alpha)
                self.carried_history[wid] = worker.throughput_history[-max(1, persistent):]
                # Only a worker whose load held steady over those reports: where the throughput changed (a move, a
                # shard turning hot or quiet) the catch-up explains the change and it counts at once, as before.
                steady = self._steady(wid, worker.throughput_history[-len(reports):]) if reports else False
                for back, (report, carried) in enumerate(reports if steady else [], start=1):
                    if len(worker.throughput_history) >= back and all(
                            len(h) >= back and h[-back] != FAILED_SAMPLE for h in worker.metric_stats.values()):
                        report[wid] = {m: h[-back] for m, h in worker.metric_stats.items()}
                        carried[wid] = worker.throughput_history[-back]
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
        self._catch_up(self.values, lagged)
        self._uncensor()
        for report, carried in reports:
            self._catch_up(report, carried)
        self.confirmed = self.centres = self.values
        self.averages = self._balancing_averages()
        if reports:  # the band as the newest values place it decides whose reports are looked at
            self.confirmed = self._confirm([report for report, _ in reports])
            self.centres = self._centres()
            self.averages = self._balancing_averages()

    # -- the load model (each strategy's own) ----------------------------------------------------------------------

    @abc.abstractmethod
    def _counts_only(self) -> bool:
        """Whether every worker is balanced on its lease count (through the throughput-share metric)."""

    @abc.abstractmethod
    def _carried_throughput(self) -> float:
        """The KiB/s a worker at the average value carries (the proportional line's run)."""

    @abc.abstractmethod
    def _fit(self, lagged: Mapping[str, float]) -> dict[str, Line]:
        """Lines fitted from the workers' reports, per metric (they replace the snapshot's lines)."""

    @abc.abstractmethod
    def _fleet_means(self) -> dict[str, float]:
        """Each metric's fleet average as the catch-up's proportional slopes use it."""

    @abc.abstractmethod
    def _balancing_averages(self) -> dict[str, float]:
        """Each metric's average to balance around (called once the values are caught up); may set `lines`."""

    @abc.abstractmethod
    def _balance(self, notes: list[str]) -> None:
        """The balancing phase: moves in memory (`apply`), and a note on what it balanced."""

    def _steady(self, wid: str, carried: tuple[float, ...]) -> bool:
        """Whether the worker carried about what it carries now during each of these reports (within STEADY_SHARE)."""
        now = self.ledger.known_throughput(wid)
        return all(abs(kbps - now) <= STEADY_SHARE * max(kbps, now) for kbps in carried)

    def _centres(self) -> dict[str, dict[str, float]]:
        """What the band's average is taken over: the value where the excess persisted, else the confirmed value.

        A worker whose excursion did not persist (a spike or dip of a report or two) counts at its confirmed value:
        it neither shifts the band nor pushes the other workers of a small fleet out of it. A worker beyond the band
        in every report counts at its moving average: its confirmed value, its report nearest the average, is biased
        towards the average by the reports' noise, and with several such workers (a fleet after shards turned hot:
        most workers below the new band) the bias lifted the band's average by 0.6 points; a receiver landed just
        under the band's edge, above it once the bias was gone, and shed again (decision 0014).
        """
        centres = {}
        for wid, vals in self.values.items():
            confirmed = self.confirmed[wid]
            centres[wid] = {m: v if self._side(m, v) == self._side(m, confirmed[m]) else confirmed[m]
                            for m, v in vals.items()}
        return centres

    def _side(self, metric: str, value: float) -> int:
        """-1 below the band around the current average, 1 above it, 0 inside (edges included)."""
        avg, half = self.averages[metric], self.half_band(metric)
        return -1 if value < avg - half else 1 if value > avg + half else 0

    def _confirm(self, reports: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
        """Each worker's values as far from the average as its last reports agree: who balancing acts on.

        `reports` holds each of the worker's last `rebalance_persistent_reports` reports on its own, caught up to the
        throughput it carries now (as its moving average is), so a move or a load change the throughput explains
        shows in all of them alike. CPU the throughput does not explain (a few seconds of spike or dip of one agent
        on a loaded host) shows in one report only: worker-mode agents report every heartbeat, and KCL's moving
        average over reports 4 s apart let one spike move leases (decision 0013). Of the moving average and those
        reports, the value nearest the fleet's average counts: a worker is out of the band only if each of its last
        reports and its average put it there, or, from four reports on, all of them but one (`_persisted`). (The
        moving averages as of successive reports would not do: a spike stays in them, halved, for reports after it.)
        Only workers whose throughput held steady over those reports have them (`_steady`), only values outside the
        band change, and moves are still priced on `values`.
        """
        confirmed = {}
        for wid, vals in self.values.items():
            states = [report[wid] for report in reports if wid in report]
            confirmed[wid] = {m: self._persisted(m, v, [state.get(m, v) for state in states])
                              for m, v in vals.items()} if states else vals
        return confirmed

    def _persisted(self, metric: str, value: float, reports: list[float]) -> float:
        """A value outside the band (around the newest values' average) as far out as its reports agree.

        A value inside keeps its moving average: taking its report nearest the average would bias every worker's
        value towards it by the reports' noise, and the band's average with it. With at least `OUTLIER_FROM` values
        (the moving average and four reports) the one nearest the average is left out: a worker about one report's
        noise beyond the band has one report inside it now and then, and asking every report to agree kept such an
        excess unconfirmed for 90 s in the simulator (scale-out seed 8; decision 0014). A spike or dip of a few
        seconds still shows in one or two reports only.
        """
        if not self._side(metric, value):
            return value
        ranked = sorted((value, *reports), key=lambda v: (abs(v - self.averages[metric]), v))
        return ranked[1] if len(ranked) >= OUTLIER_FROM else ranked[0]

    def add_share(self) -> list[str]:
        """Give each worker that reports a metric the throughput-share metric `T` as well; returns those workers.

        For the band strategy's fill on throughput (coordinator/deciders/band_moves.py `fill_on_share`) when no
        reported metric tells the workers apart. Its value is the share of the average KiB/s the worker carries now
        (as for workers without metrics); its confirmed value the share nearest the average of that and what it
        carried at each report within the persistence window, so a worker counts as far below only if it was so at
        each of those reports (a new worker, not a few seconds of low figures). `drop_share` takes it away again.
        """
        added = [wid for wid in self.active if wid not in self.default and THROUGHPUT_METRIC not in self.values[wid]]
        if not added or self.count_only or self.target_throughput <= 0:
            return []
        if self.confirmed is self.values:
            self.confirmed = dict(self.values)
        scale = 100.0 / self.target_throughput
        self.lines.setdefault(THROUGHPUT_METRIC, Line(0.0, scale))
        self._share_average = self.averages.get(THROUGHPUT_METRIC)  # workers without metrics have one already
        self.averages[THROUGHPUT_METRIC] = 100.0
        for wid in added:
            now = scale * self.ledger.throughput.get(wid, 0.0)
            past = tuple(scale * kbps for kbps in self.carried_history.get(wid, ()))
            self.values[wid] = {**self.values[wid], THROUGHPUT_METRIC: now}
            self.confirmed[wid] = {**self.confirmed[wid], THROUGHPUT_METRIC: _nearest((now, *past), 100.0)}
            self.limits[wid] = {**self.limits[wid], THROUGHPUT_METRIC: math.inf}
        return added

    def drop_share(self, added: list[str]) -> None:
        """Take the throughput-share metric `add_share` gave these workers away again (their summaries as before)."""
        for wid in added:
            for table in (self.values, self.confirmed, self.limits):
                table[wid] = {m: v for m, v in table[wid].items() if m != THROUGHPUT_METRIC}
        if self._share_average is None:
            del self.averages[THROUGHPUT_METRIC]
        else:
            self.averages[THROUGHPUT_METRIC] = self._share_average

    def _catch_up(self, values: dict[str, dict[str, float]], lagged: Mapping[str, float]) -> None:
        """Add to each value in `values` what its moving average has not seen yet of the worker's throughput change.

        The leader records the throughput a worker carried at each of its reports (`throughput_history`); the gap
        between the throughput it carries now (pending handoffs counted where they go) and the moving average of
        that history is load the reports do not show yet: a lease just moved, a shard that just turned hot. When the
        reports miss most of the change (an unsettled worker, e.g. right after a cold start), the line's value for
        the throughput it carries now replaces them.
        """
        if self.ledger.unit_weights:  # no throughput figures: nothing to compare with
            return
        slopes = {m: proportional(avg, self.carried_throughput).slope for m, avg in self._fleet_means().items()}
        slopes.update((m, line.slope) for m, line in self.lines.items())
        bases = {m: line.base for m, line in self.lines.items()}
        for wid, seen in lagged.items():
            now = self.ledger.known_throughput(wid)
            gap = now - seen
            if not gap or wid not in values:
                continue
            if wid in self.unsettled:  # reports too far behind: the line's value for what it carries now
                caught_up = {m: bases.get(m, 0.0) + slopes[m] * now for m in values[wid]}
            else:
                caught_up = {m: max(0.0, v + slopes[m] * gap) for m, v in values[wid].items()}
            if all(math.isfinite(v) for v in caught_up.values()):  # degenerate (subnormal) throughput: keep reports
                values[wid] = caught_up

    def _uncensor(self) -> None:
        """Price a saturated worker (newest report at `SATURATED` or more) at the fitted line's value for its load.

        A host at 100 % CPU reports 100 however much more its leases would take, so its own value understates what
        each of its leases weighs: priced at it, its sheds were planned to land it 1.7 points under its ceiling
        and it landed above (fleet_sim, hot shards, full size, seed 8: two 1,024 KiB/s shards on one worker). Only a
        line fitted from the reports (this run's or the leader's last) is trusted with it; never lowers a value.
        """
        for wid, metrics in self.saturated.items():
            for metric in metrics:
                line = self.lines.get(metric)
                if line is not None and wid in self.active:
                    projected = line.base + line.slope * self.ledger.known_throughput(wid)
                    self.values[wid][metric] = max(self.values[wid][metric], projected)

    def _averages(self, active_only: bool = False,
                  values: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, float]:
        """Per metric: the load of every worker with it over the non-draining ones (KCL's fleet average).

        With `active_only`, draining workers' load is left out (band mode adds their leases' share instead). Of
        `values` (`confirmed` for the band's average), else of the current values.
        """
        # Every metric any worker reports gets an entry (0 when no non-draining worker reports it), so a lookup by a
        # worker's metric can never miss: a lone metric name on a draining worker is a normal state (rolling deploy).
        totals = dict.fromkeys(self.metrics, 0.0)
        receivers = dict.fromkeys(self.metrics, 0)
        for wid, vals in (self.values if values is None else values).items():
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
        self._values_before[key] = {w: self.values[w] for w in (source, wid) if w is not None and w in self.values}
        if source is not None and source in self.values:
            self.values[source] = {m: v - self.drop(source, m, key) for m, v in self.values[source].items()}
        self.values[wid] = self.projected(wid, weight)
        self.ledger.move(key, wid, reason, detail)

    def take_back(self, key: str) -> tuple[str | None, str]:
        """Undo `apply` of `key` (the newest move not undone yet): values and ledger as before; (giver, taker)."""
        taker = self.ledger.moves[key].to_worker
        self.values.update(self._values_before.pop(key))
        return self.ledger.take_back(key), taker

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
            else:
                chosen = self._heavy_receiver(heap, chosen, lease)
            neg_room, _, wid = chosen
            detail = f"most room {-neg_room:.3g}; silent {lease.silent_ms} ms"
            self.apply(lease.key, wid, priority_reason(lease), detail)
            self._requeue(heap, wid)

    def _heavy_receiver(self, heap: list[HeapEntry], chosen: HeapEntry, lease: LeaseView) -> HeapEntry:
        """Where a priority lease goes that may not fit `chosen`, the roomiest worker: there, KCL's rule.

        A strategy with a band may pick another of the roomiest (putting the rest back into the heap).
        """
        return chosen

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

    def band_ceiling(self, wid: str, metric: str) -> float:
        """The highest value the worker may reach on `metric`: the band's upper edge or its operating range."""
        return min(self.averages[metric] + self.half_band(metric), self.limits[wid][metric])

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

    def plan(self, balance: bool) -> Plan:
        """Priority assignment, then drain, then (on balancing runs) the strategy's balancing."""
        notes: list[str] = []
        if self.ledger.unit_weights and self.ledger.leases:
            notes.append("total throughput is 0: every lease weighs 1, so balancing counts leases")
        heap = self._queue()
        # Unowned and expired leases go to a worker with a late heartbeat only if no worker has a fresh one (every
        # heartbeat delayed on a loaded host): an owner that may be slow beats none. Handoffs never go to one.
        self._assign_priority(heap if heap or not self.stale else self._queue(stale_ok=True))
        self._drain(heap)
        if balance:
            self._balance(notes)
        return Plan(
            strategy=self.strategy,
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


def _nearest(values: tuple[float, ...], target: float) -> float:
    """The value nearest `target` (the lower one on a tie)."""
    return min(values, key=lambda value: (abs(value - target), value))


def _newest(history: Sequence[float]) -> float:
    """A metric history's newest sample that did not fail (-1 if none did not)."""
    return next((v for v in reversed(history) if v != FAILED_SAMPLE), FAILED_SAMPLE)
