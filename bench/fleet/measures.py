"""Balance measures of a simulated fleet: max/mean ratios, the balance bound, and the fewest moves that reach it."""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.fleet.model import Fleet

THRESHOLD = 1.10  # max/mean load that counts as balanced (1 + reBalanceThresholdPercentage / 100)


def ratio(loads: dict[str, float]) -> float:
    """max/mean of the loads (1.0 for an empty or all-zero fleet)."""
    values = list(loads.values())
    mean = statistics.fmean(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0


def lpt_ratio(weights: Iterable[float], workers: int) -> float:
    """max/mean of a longest-processing-time-first packing: a near-optimal reference for what is achievable."""
    bins = [0.0] * max(1, workers)
    for weight in sorted(weights, reverse=True):
        heapq.heapreplace(bins, bins[0] + weight)
    mean = statistics.fmean(bins)
    return max(bins) / mean if mean > 0 else 1.0


def within_bound(fleet: Fleet, metric: str) -> bool:
    """Balanced: every worker's load at most THRESHOLD x max(mean, the load of its heaviest lease alone).

    With Zipf shards on many workers one shard alone can exceed the mean (the big 500-shard fleet: LPT packing
    reaches max/mean 4.6), so max/mean <= 1.10 cannot be reached; a worker holding such a shard may carry up to
    THRESHOLD x that shard, every other worker is held to THRESHOLD x the mean. Equal to max/mean <= THRESHOLD
    wherever no lease outweighs the mean.
    """
    loads = fleet.loads(metric)
    if not loads:
        return True
    mean = statistics.fmean(loads.values())
    tops = fleet.heaviest_held(metric)
    return all(load <= THRESHOLD * max(mean, tops.get(w, 0.0)) for w, load in loads.items())


def minimum_moves(fleet: Fleet) -> tuple[int, int]:
    """The fewest owner changes that can reach max/mean <= THRESHOLD from the assignment at the event: (forced, shed).


    Every lease that is unowned or held by a leaving (crashed, drained) worker must move; every staying worker whose
    load exceeds its ceiling (THRESHOLD x max(mean, its heaviest lease); see `within_bound`) after the event must
    shed at least the fewest of its leases (largest first) that cover the excess. A lease so heavy that even the
    least loaded other worker would pass THRESHOLD x the mean with it can only move if its receiver sheds too, so it
    costs two moves: a worker's count is the smaller of "only leases others can take" and "any leases, plus one".
    The same holds for a lease that must move: if it puts even the least loaded staying worker above its ceiling,
    some worker sheds at least once (one shed, unless the staying workers' own excess already costs one).
    A lower bound: moving leases onto a worker never lowers another worker's excess. `forced` alone is the minimum
    for every strategy; `shed` only binds a strategy that does reach the band.
    """
    idle = fleet.stream.total() <= 0
    stay = fleet.live()
    held: dict[str, list[float]] = {w: [] for w in stay}
    moving: list[float] = []
    for lease in fleet.leases():
        owner = lease.actual_owner
        weight = 1.0 if idle else fleet.stream.kbps.get(lease.lease_key, 0.0)
        if owner in held:
            held[owner].append(weight)
        else:
            moving.append(weight)
    forced = len(moving)
    total = len(fleet.leases()) if idle else fleet.stream.total()
    mean = total / max(1, len(stay))
    loads = {w: sum(weights) for w, weights in held.items()}
    shed = 0
    for wid, weights in held.items():
        ceiling = THRESHOLD * max([mean, *weights])
        if loads[wid] <= ceiling:
            continue
        room = THRESHOLD * mean - min((load for w, load in loads.items() if w != wid), default=0.0)
        takeable = [w for w in weights if w <= room]
        any_count = _cover(weights, loads[wid] - ceiling)
        heavy_extra = 1 if len(takeable) < len(weights) else 0
        shed += min(_cover(takeable, loads[wid] - ceiling), any_count + heavy_extra)
    lightest = min(loads.values(), default=0.0)
    if stay and any(lightest + weight > THRESHOLD * max(mean, weight) for weight in moving):
        shed = max(shed, 1)  # a lease no staying worker can take within its ceiling: its receiver sheds
    return forced, shed


def greedy_moves(fleet: Fleet) -> tuple[int, bool]:
    """Moves an offline greedy with exact loads makes from the assignment at the event, and whether it reached the
    balance bound: an achievable count, so the true minimum lies between `minimum_moves` and this.

    Leases that must move go largest first to the least loaded worker; then, while a worker is above its ceiling,
    the most loaded one gives the lease nearest half its gap to the least loaded one.
    """
    idle = fleet.stream.total() <= 0
    held: dict[str, list[float]] = {w: [] for w in fleet.live()}
    if not held:
        return 0, True
    forced: list[float] = []
    for lease in fleet.leases():
        weight = 1.0 if idle else fleet.stream.kbps.get(lease.lease_key, 0.0)
        held.get(lease.actual_owner or "", forced).append(weight)
    loads = {w: sum(weights) for w, weights in held.items()}
    moves = 0
    for weight in sorted(forced, reverse=True):
        wid = min(loads, key=lambda w: (loads[w], w))
        held[wid].append(weight)
        loads[wid] += weight
        moves += 1
    mean = sum(loads.values()) / len(loads)
    for _ in range(10 * len(fleet.stream.shards) + 10):
        over = [w for w in loads if loads[w] > THRESHOLD * max([mean, *held[w]]) * (1 + 1e-9)]
        if not over:
            return moves, True
        donor = max(over, key=lambda w: (loads[w], w))
        receiver = min(loads, key=lambda w: (loads[w], w))
        gap = loads[donor] - loads[receiver]
        candidates = [weight for weight in held[donor] if weight < gap]
        if not candidates:
            break
        weight = min(candidates, key=lambda c: abs(c - gap / 2))
        held[donor].remove(weight)
        held[receiver].append(weight)
        loads[donor] -= weight
        loads[receiver] += weight
        moves += 1
    return moves, False


def _cover(weights: list[float], excess: float) -> int:
    """How many of `weights`, largest first, cover `excess` (more than all of them if they cannot)."""
    count = 0
    for weight in sorted(weights, reverse=True):
        if excess <= 0:
            return count
        excess -= weight
        count += 1
    return count if excess <= 0 else len(weights) + 1
