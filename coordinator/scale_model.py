"""How many workers the fleet needs for its load at a target utilisation, and which worker to remove first.

Pure: no I/O and no clock of its own; the leader passes each full run's snapshot, the largest lag its leases report
and the run's monotonic time (coordinator/leader_loop.py), and publishes the figure (services/leader_status.py).

Invariants:
* `desired` is an integer in [scale_min_workers, scale_max_workers], at least 1, whatever the reports say.
* A worker's capacity comes from its own reports: the KiB/s it carried at its reports (their moving average) per
  metric point above the fleet's fitted base (`value = base + slope x throughput`, coordinator/load_model.py),
  extended to its operating range x `scale_target_utilisation_percentage`, at most `max_throughput_per_host_kbps`
  x the target. Workers carrying less than MIN_LOAD_POINTS above the base give no estimate (too little to
  extrapolate from); such a worker, and one without metrics (KCL's default metric), has `max_throughput_per_host_kbps`
  x the target, if that is set. The fleet's per-worker capacity is the median of the known ones.
* The need: ceil(load / capacity), load being every open lease's throughput (leases needing an owner included);
  at least ceil(open leases / `max_leases_for_worker`); a scale-in counts only where the smaller fleet would sit
  IN_MARGIN below the target. No capacity known while a lease carries load (or reports none yet): the current
  count (and the lease bound). An idle stream (every figure 0, or no lease) needs the minimum. A growing lag
  (LAG_FLOOR_MILLIS behind and rising by at least LAG_GROWTH_SHARE of the time passing, over half the scale-out
  window or more) needs one worker more than there are, and blocks scale-in.
* Hysteresis: the count rises only once every run for `scale_out_after_millis` asked for more (to the smallest ask
  of that window's second half: a load ramping in through the throughput averages rises once) and falls only once
  every run for `scale_in_after_millis` asked for fewer (to the largest ask of that window, once the last
  `scale_out_after_millis` asked for it too: a draining load falls once; at most two windows); a run asking for the
  current count ends a pending change, while a run without a capacity estimate neither asks for fewer nor ends
  anything (only the lease bound or a growing lag ask for more in it). So the count changes at most once per
  direction per window. A term's count starts at the count its predecessor published, if that is at most a scale-in
  window old (`inherited`: a leader change neither drops nor raises what an autoscaler reads), else at the number of
  workers there are at its first run that sees one (before that, for up to a scale-out window, it has no figure: a
  new leader has not yet seen its workers alive).
* The removal candidate is a non-draining worker with a fresh heartbeat holding the fewest leases (then the least
  throughput, then the smallest id); the previous candidate stays while it holds no more leases than the cheapest.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardherd.coordinator.load_model import Line
from shardherd.coordinator.snapshot import Snapshot, WorkerView
from shardherd.shared.config import Settings
from shardherd.shared.worker_metrics import WorkerStatus, classify, ema

MIN_LOAD_POINTS = 2.0  # a worker this little above the base says too little about its slope
IN_MARGIN = 0.9  # a scale-in counts where the smaller fleet would sit at or under 90 % of the target
LAG_FLOOR_MILLIS = 5_000  # a lag under this is not a trend (a checkpoint cadence's worth of noise)
LAG_GROWTH_SHARE = 0.1  # growing: the lag rose by at least a tenth of the time that passed
EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class ScaleSettings:
    """The model's knobs (from `Settings`): target utilisation, bounds, windows, per-worker limits."""

    target_percentage: float = 70.0
    min_workers: int = 1
    max_workers: int = 1000
    out_after: float = 60.0  # seconds
    in_after: float = 300.0  # seconds
    max_leases_for_worker: int = 2**31 - 1
    max_throughput_per_host_kbps: float = math.inf
    ema_alpha: float = 0.5

    @classmethod
    def from_settings(cls, settings: Settings) -> ScaleSettings:
        """The scale part of the process settings (validated there)."""
        return cls(target_percentage=settings.scale_target_utilisation_percentage,
                   min_workers=settings.scale_min_workers, max_workers=settings.scale_max_workers,
                   out_after=settings.scale_out_after_millis / 1000, in_after=settings.scale_in_after_millis / 1000,
                   max_leases_for_worker=settings.max_leases_for_worker,
                   max_throughput_per_host_kbps=settings.max_throughput_per_host_kbps,
                   ema_alpha=settings.worker_metrics_ema_alpha)

    def clamp(self, count: int) -> int:
        """`count` within [min_workers, max_workers] and at least 1."""
        return max(1, self.min_workers, min(self.max_workers, count))


@dataclass(frozen=True, slots=True)
class ScaleFigure:
    """What the leader publishes: the count autoscalers should run, how many run now, who goes first, and why."""

    desired: int
    current: int
    remove_first: str | None
    reasons: tuple[str, ...]
    load_kbps: float
    capacity_kbps: float | None  # per worker at the target; None: no worker's reports tell


@dataclass(frozen=True, slots=True)
class ScaleState:
    """What the model keeps between runs (one leader term): the count, a pending change, recent lags."""

    desired: int | None = None
    pending: int = 0  # +1 a scale-out, -1 a scale-in waiting for its window, 0 none
    since: float = 0.0  # monotonic seconds the pending change was first asked for
    ask: int = 0  # the count the pending change goes to if its window passed now
    asks: tuple[tuple[float, int], ...] = ()  # a pending change's (monotonic seconds, ask): out, the last half
    # `out_after` s; in, the last `in_after` s
    lags: tuple[tuple[float, int], ...] = ()  # (monotonic seconds, largest lag in ms) within the scale-out window
    remove_first: str | None = None
    began: float | None = None  # monotonic seconds of the term's first run


def inherited(previous: tuple[int, str | None, float] | None, now_wall: float, cfg: ScaleSettings) -> ScaleState:
    """A new term's state: the predecessor's published (count, removal candidate, wall time), unless none or stale.

    A count older than the scale-in window says nothing about the fleet now (the leaders were down or stalled that
    long): the term then starts afresh from the workers it sees. Replicas' wall clocks differ a little, and a
    handover can follow the last publication within a second, so a count up to a scale-out window "from the future"
    still counts; one further ahead came from a clock that was stepped.
    """
    if previous is None:
        return ScaleState()
    desired, remove_first, computed_at = previous
    if not -cfg.out_after <= now_wall - computed_at <= cfg.in_after:
        return ScaleState()
    return ScaleState(desired=max(cfg.min_workers, min(cfg.max_workers, desired)), remove_first=remove_first)


@dataclass(frozen=True, slots=True)
class _Need:
    out: int  # a count above the current one asks for a scale-out
    fewer: int  # a count below the current one asks for a scale-in
    reasons: tuple[str, ...]
    known: bool = True  # False: no capacity estimate; the run asks for no scale-in and cancels nothing


def _ceil(value: float) -> int:
    return math.ceil(value - EPSILON)


def _carried(snapshot: Snapshot) -> dict[str, float]:
    """KiB/s each worker processes now (the leases it actually owns)."""
    carried: dict[str, float] = {}
    for lease in snapshot.leases:
        owner = lease.actual_owner
        if owner is not None and not lease.finished:
            carried[owner] = carried.get(owner, 0.0) + (lease.throughput_kbps or 0.0)
    return carried


def worker_capacity(worker: WorkerView, carried_now: float, lines: Mapping[str, Line],
                    cfg: ScaleSettings) -> float | None:
    """KiB/s the worker would carry at the target utilisation (see the module's invariants); None if unknown."""
    # The host limit at the target: all a default-metric worker has, the bound of any estimate, and what a worker
    # with no estimate carries (a fleet of idle-looking CPU workers past its limits must still ask for more).
    host = cfg.max_throughput_per_host_kbps * cfg.target_percentage / 100
    if worker.uses_default_metric:
        return host if math.isfinite(host) else None
    carried = ema(worker.throughput_history, cfg.ema_alpha) if worker.throughput_history else carried_now
    caps = []
    for metric, history in worker.metric_stats.items():
        value = ema(history, cfg.ema_alpha)
        base = lines[metric].base if metric in lines else 0.0
        ceiling = worker.operating_range[metric][0] * cfg.target_percentage / 100
        if carried > 0 and value - base >= MIN_LOAD_POINTS and ceiling > base:
            caps.append(carried * (ceiling - base) / (value - base))
    if not caps:
        return host if math.isfinite(host) else None
    return min(min(caps), host)


def _members(snapshot: Snapshot) -> list[WorkerView]:
    """The workers the count counts: not draining."""
    return [w for w in snapshot.workers if not w.draining]


def fleet_capacity(snapshot: Snapshot, cfg: ScaleSettings) -> float | None:
    """The median capacity of the non-draining workers with valid reports that give one; None if none does."""
    carried = _carried(snapshot)
    caps = [worker_capacity(w, carried.get(w.worker_id, 0.0), snapshot.lines, cfg) for w in _members(snapshot)
            if classify(w) is WorkerStatus.ACTIVE]
    known = [cap for cap in caps if cap is not None and cap > 0 and math.isfinite(cap)]
    return statistics.median(known) if known else None


def lag_growing(lags: Sequence[tuple[float, int]], window: float) -> bool:
    """True if the largest lag is over the floor and rose over at least half the window by LAG_GROWTH_SHARE."""
    if len(lags) < 2:
        return False
    (first_at, first), (last_at, last) = lags[0], lags[-1]
    span = last_at - first_at
    return last >= LAG_FLOOR_MILLIS and span >= max(window / 2, EPSILON) and last - first >= \
        LAG_GROWTH_SHARE * span * 1000


def _by_load(load: float, unknown: bool, capacity: float | None, current: int,
             cfg: ScaleSettings) -> tuple[int, int, str, bool]:
    """The asks from throughput alone: (more, fewer, reason, whether a capacity estimate backs them)."""
    if capacity is None and (load > 0 or unknown):
        return current, current, f"no capacity estimate (no worker reports load above its base): holding {current}", \
            False
    if load <= 0:
        return 1, 1, "idle: no lease reports any throughput", True
    assert capacity is not None
    out = _ceil(load / capacity)
    reason = f"load {load:.1f} KiB/s over {capacity:.1f} KiB/s per worker at {cfg.target_percentage:g} % -> {out}"
    return out, _ceil(load / (capacity * IN_MARGIN)), reason, True


def need(snapshot: Snapshot, cfg: ScaleSettings, lagging: bool) -> tuple[_Need, float, float | None]:
    """The run's asks (before hysteresis), the load (KiB/s) and the per-worker capacity."""
    open_leases = [lease for lease in snapshot.leases if not lease.finished]
    load = sum(lease.throughput_kbps or 0.0 for lease in open_leases)
    unknown = any(lease.throughput_kbps is None for lease in open_leases)  # a lease whose load nobody reported
    capacity = fleet_capacity(snapshot, cfg)
    current = len(_members(snapshot))
    out, fewer, reason, known = _by_load(load, unknown, capacity, current, cfg)
    reasons = [reason]
    by_leases = _ceil(len(open_leases) / cfg.max_leases_for_worker)
    if by_leases > out:
        reasons.append(f"{len(open_leases)} leases at most {cfg.max_leases_for_worker} per worker -> {by_leases}")
    out, fewer = max(out, by_leases), max(fewer, by_leases)
    if lagging:
        out, fewer = max(out, current + 1), max(fewer, current + 1)
        reasons.append(f"lag growing -> at least {current + 1}")
    if cfg.clamp(out) != out:
        reasons.append(f"bounded to [{cfg.min_workers}, {cfg.max_workers}] -> {cfg.clamp(out)}")
    return _Need(cfg.clamp(out), cfg.clamp(max(out, fewer)), tuple(reasons), known), load, capacity


def settle(state: ScaleState, asked: _Need, current: int, now: float,
           cfg: ScaleSettings) -> tuple[ScaleState, str | None]:
    """The count after this run's ask under the hysteresis rules, and a note on a change still pending."""
    desired = state.desired if state.desired is not None else cfg.clamp(current)
    desired = cfg.clamp(desired)  # the bounds may have changed with a new term's settings
    state = dataclasses.replace(state, desired=desired)
    if asked.out > desired:
        return _settle_out(state, asked.out, now, cfg)
    if asked.known and asked.fewer < desired:
        return _settle_in(state, asked.fewer, now, cfg)
    return (state if not asked.known else dataclasses.replace(state, pending=0, asks=())), None


def _settle_out(state: ScaleState, ask: int, now: float, cfg: ScaleSettings) -> tuple[ScaleState, str | None]:
    """A run asking for more: once its window passed, the smallest ask of the window's second half.

    Every run of the window asked for more, so a spike shorter than the window sets nothing; the second half's
    smallest ask is what the load held for half a window. A load that steps up reaches the asks through the
    throughput averages (`lease_throughput_window_millis`, 30 s) in about half a default window: the count rises
    once, to the new load, instead of to the first half's partial ask and again a window later.
    """
    since = state.since if state.pending > 0 else now
    kept = state.asks if state.pending > 0 else ()
    asks = (*(a for a in kept if now - a[0] <= cfg.out_after / 2), (now, ask))
    held = min(a for _, a in asks)
    if now - since >= cfg.out_after:
        return dataclasses.replace(state, desired=held, pending=0, asks=()), None
    return (dataclasses.replace(state, pending=1, since=since, ask=held, asks=asks),
            f"scale-out to {held} pending for {now - since:.0f} of {cfg.out_after:.0f} s")


def _settle_in(state: ScaleState, ask: int, now: float, cfg: ScaleSettings) -> tuple[ScaleState, str | None]:
    """A run asking for fewer: `scale_in_to` decides when, and to what."""
    since = state.since if state.pending < 0 else now
    kept = state.asks if state.pending < 0 else ()
    asks = (*(a for a in kept if now - a[0] <= cfg.in_after), (now, ask))
    target = scale_in_to(asks, since, now, cfg)
    if target is not None:
        return dataclasses.replace(state, desired=target, pending=0, asks=()), None
    largest = max(a for _, a in asks)
    return (dataclasses.replace(state, pending=-1, since=since, ask=largest, asks=asks),
            f"scale-in to {largest} pending for {now - since:.0f} of {cfg.in_after:.0f} s")


def scale_in_to(asks: Sequence[tuple[float, int]], since: float, now: float, cfg: ScaleSettings) -> int | None:
    """The count a pending scale-in falls to now, or None while it waits.

    It waits the whole `in_after` window, then falls to the largest ask of the last `in_after` seconds, once the asks
    stopped falling (the last `out_after` seconds asked for that much): a load that drains over a minute or two (a
    throughput average decaying) ends in one fall, not a fall to a halfway count and another a window later. A load
    still falling after two windows falls anyway.
    """
    if now - since < cfg.in_after:
        return None
    largest = max(a for _, a in asks)
    settled = max(a for at, a in asks if now - at <= cfg.out_after) == largest
    return largest if settled or now - since >= 2 * cfg.in_after else None


def removal_candidate(snapshot: Snapshot, previous: str | None) -> str | None:
    """The worker whose leases move cheapest (see the module's invariants); None without one."""
    members = [w.worker_id for w in _members(snapshot) if not w.stale]
    if not members:
        return None
    carried = _carried(snapshot)
    counts = dict.fromkeys(members, 0)
    for lease in snapshot.leases:
        if lease.actual_owner in counts and not lease.finished:
            counts[lease.actual_owner] += 1
    cheapest = min(members, key=lambda w: (counts[w], carried.get(w, 0.0), w))
    if previous in counts and counts[previous] <= counts[cheapest]:
        return previous
    return cheapest


def step(state: ScaleState, snapshot: Snapshot, largest_lag_millis: int | None, now: float,
         cfg: ScaleSettings) -> tuple[ScaleState, ScaleFigure | None]:
    """One run of the model: the new state and the figure to publish (None: none yet, see the invariants)."""
    current = len(_members(snapshot))
    began = now if state.began is None else state.began
    if state.desired is None and current == 0 and now - began < cfg.out_after:
        return dataclasses.replace(state, began=began), None
    lags = state.lags
    if largest_lag_millis is not None:
        lags = tuple(s for s in (*lags, (now, largest_lag_millis)) if now - s[0] <= cfg.out_after)
    else:
        lags = ()
    asked, load, capacity = need(snapshot, cfg, lag_growing(lags, cfg.out_after))
    state, note = settle(dataclasses.replace(state, lags=lags, began=began), asked, current, now, cfg)
    remove = removal_candidate(snapshot, state.remove_first)
    state = dataclasses.replace(state, remove_first=remove)
    assert state.desired is not None
    reasons = (*asked.reasons, note) if note else asked.reasons
    return state, ScaleFigure(state.desired, current, remove, reasons, load, capacity)
