"""Balance measures of a simulated fleet: max/mean ratios, the balance bound, and the fewest moves that reach it."""

from __future__ import annotations

import heapq
import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from shardherd.coordinator.deciders.band_moves import leases_to_cover

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


def minimum_moves(fleet: Fleet, metric: str = "tp") -> tuple[int, int]:
    """The fewest owner changes that can reach the balance bound in `metric` from the assignment at the event:
    (forced, shed).

    `metric` is `within_bound`'s: `tp` (carried KiB/s) or `cpu` (the modelled CPU: the model's base plus each
    lease's KiB/s over the fleet's capacity, so a lease weighs `kbps / capacity` points and every worker carries the
    base besides). Every lease that is unowned or held by a leaving (crashed, drained) worker must move; every
    staying worker whose load exceeds its ceiling (THRESHOLD x max(mean, its heaviest lease alone)) after the event
    must shed at least the fewest of its leases (largest first) that cover the excess. A lease too heavy for even
    the least loaded other worker to take within THRESHOLD x the mean can only move if its receiver sheds too: a
    donor's count is the smaller of "only leases others can take" and "any leases, plus the fewest of its own
    leases the worker taking the heavy one must then shed". Donors whose heavy leases may share one
    receiver are counted with every grouping tried (`_receiver_sheds`).
    A lower bound for plans that move each lease at most once and hand heavy leases to workers under their
    ceiling (moving a lease twice, or onto a worker that must shed anyway, never saves a move); `forced` alone is
    the minimum for every strategy; `shed` only binds a strategy that does reach the bound.
    """
    idle = fleet.stream.total() <= 0
    stay = fleet.live()
    cpu = metric == "cpu"
    base = fleet.cpu_model.base if cpu else 0.0
    scale = 1.0 / fleet.capacity if cpu else 1.0
    held: dict[str, list[float]] = {w: [] for w in stay}
    moving: list[float] = []
    for lease in fleet.leases():
        weight = 1.0 if idle and not cpu else fleet.stream.kbps.get(lease.lease_key, 0.0) * scale
        held.get(lease.actual_owner or "", moving).append(weight)
    forced = len(moving)
    loads = {w: base + sum(weights) for w, weights in held.items()}
    total = sum(loads.values()) + sum(moving)
    mean = total / max(1, len(stay))

    def ceiling(weights: list[float]) -> float:
        return THRESHOLD * max([mean, *(base + w for w in weights)])

    shed = 0
    heavy: list[tuple[int, int, float]] = []  # donors a heavy lease might serve: (light count, any count, weight)
    for wid, weights in held.items():
        excess = loads[wid] - ceiling(weights)
        if excess <= 0:
            continue
        room = THRESHOLD * mean - min((load for w, load in loads.items() if w != wid), default=0.0)
        light = leases_to_cover([w for w in weights if w <= room], excess)
        lightest_heavy = min((w for w in weights if w > room), default=None)
        if lightest_heavy is None or leases_to_cover(weights, excess) >= light:
            shed += light
        else:
            heavy.append((light, leases_to_cover(weights, excess), lightest_heavy))
    receivers = [sorted(weights, reverse=True) for wid, weights in held.items() if loads[wid] <= ceiling(weights)]
    room = THRESHOLD * mean - min(loads.values(), default=0.0)  # the most any worker can take within the mean's bound
    shed += _heavy_donors(heavy, lambda extra: _receiver_sheds(receivers, base, room, extra, ceiling))
    lightest = min(loads.values(), default=0.0)
    if stay and any(lightest + weight > ceiling([weight]) for weight in moving):
        shed = max(shed, 1)  # a lease no staying worker can take within its ceiling: its receiver sheds
    return forced, shed


# Up to this many donors whose heavy lease could save moves, every way to share receivers is tried (Bell(6) = 203
# groupings per subset); beyond it each such donor counts one shed of its receiver, as the counting bound did before.
GROUPED_DONORS = 6


def _heavy_donors(donors: list[tuple[int, int, float]], sheds: Callable[[list[float]], float]) -> int:
    """The fewest moves of donors that may each shed light leases or hand on a heavy one, receivers' sheds counted."""
    if len(donors) > GROUPED_DONORS:
        return sum(min(light, any_count + 1) for light, any_count, _ in donors)
    best: float = sum(light for light, _, _ in donors)
    for size in range(1, len(donors) + 1):
        for chosen in itertools.combinations(range(len(donors)), size):
            own = sum(donors[i][1] for i in chosen) + sum(d[0] for i, d in enumerate(donors) if i not in chosen)
            for blocks in _partitions(list(chosen)):
                best = min(best, own + sum(sheds([donors[i][2] for i in block]) for block in blocks))
    return int(best)


def _partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """Every way to split `items` into non-empty groups."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for blocks in _partitions(rest):
        yield [[first], *blocks]
        for at in range(len(blocks)):
            yield [*blocks[:at], [first, *blocks[at]], *blocks[at + 1:]]


def _receiver_sheds(receivers: list[list[float]], base: float, room: float, extra: list[float],
                    ceiling: Callable[[list[float]], float]) -> float:
    """The fewest of its own leases some worker under its ceiling sheds to take the `extra` leases and stay under it.

    0 where a worker can take them as they are: a lease heavier than the mean raises its holder's ceiling with it.
    """
    best: float | None = None
    for weights in receivers:
        over = base + sum(weights) + sum(extra) - ceiling([*weights, *extra])
        if over > sum(weights):
            continue  # shedding everything it holds would not make room
        # What it sheds is light, or heavy itself and then costs its own receiver a shed.
        light = [w for w in weights if w <= room]
        shed_light = leases_to_cover(light, over) if sum(light) >= over else math.inf
        count = min(shed_light, leases_to_cover(weights, over) + 1) if over > 0 else 0
        best = count if best is None else min(best, count)
    return math.inf if best is None else best  # nobody can take them: this way is closed


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
