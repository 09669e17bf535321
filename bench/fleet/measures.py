"""Balance measures of a simulated fleet: max/mean ratios, the balance bound, and the fewest moves that reach it."""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.fleet.model import Fleet

THRESHOLD = 1.10  # max/mean load that counts as balanced (1 + reBalanceThresholdPercentage / 100)


def leases_to_cover(weights: list[float], needed: float) -> int:
    """How many of `weights`, largest first, add up to `needed` (one more than all of them if they cannot)."""
    count, total = 0, 0.0
    for weight in sorted(weights, reverse=True):
        if total >= needed:
            break
        total += weight
        count += 1
    return count if total >= needed else len(weights) + 1


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
    donor's count is the least over its ways (`_shed_ways`): only leases others can take, or some of its heavy
    leases plus light ones, each heavy lease charged the fewest leases the worker taking it must then shed. Heavy
    leases that may share one receiver are counted with every grouping tried (`_receiver_sheds`).
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

    shed, own_only, heavy = _donors(held, loads, mean, ceiling)
    receivers = [sorted(weights, reverse=True) for wid, weights in held.items() if loads[wid] <= ceiling(weights)]
    room = THRESHOLD * mean - min(loads.values(), default=0.0)  # the most any worker can take within the mean's bound
    shed += _heavy_donors(heavy, functools.cache(
        lambda extra: _receiver_sheds(receivers, base, room, list(extra), ceiling)))
    if not math.isfinite(shed):  # no plan of that kind reaches the bound: at least each donor's own moves
        shed = own_only
    lightest = min(loads.values(), default=0.0)
    if stay and any(lightest + weight > ceiling([weight]) for weight in moving):
        shed = max(shed, 1)  # a lease no staying worker can take within its ceiling: its receiver sheds
    return forced, int(shed)


# A donor's way to shed: (its own moves, the leases too heavy for anyone that its receivers must take).
Way = tuple[float, tuple[float, ...]]


def _donors(held: dict[str, list[float]], loads: dict[str, float], mean: float,
            ceiling: Callable[[list[float]], float]) -> tuple[float, int, list[list[Way]]]:
    """Over the workers above their ceiling: the sheds of those with one way to shed, every donor's fewest own
    moves (receivers left out), and the ways of those whose heavy leases might save moves."""
    shed = 0.0
    own_only = 0
    heavy: list[list[Way]] = []
    for wid, weights in held.items():
        excess = loads[wid] - ceiling(weights)
        if excess <= 0:
            continue
        own_only += leases_to_cover(weights, excess)
        room = THRESHOLD * mean - min((load for w, load in loads.items() if w != wid), default=0.0)
        ways = _shed_ways(weights, room, excess)
        if len(ways) == 1:
            shed += ways[0][0]
        else:
            heavy.append(ways)
    return shed, own_only, heavy

# Up to this many donors whose heavy leases could save moves, and this many heavy leases in one combination of their
# ways, every way to share receivers is tried (Bell(6) = 203 groupings); beyond it each heavy lease counts one shed
# of its receiver (none where some worker takes it without one), as the counting bound did before.
GROUPED_DONORS = 6


def _shed_ways(weights: list[float], room: float, excess: float) -> list[Way]:
    """A donor's ways to cover its excess: light leases only (first), or its `h` heaviest leases too heavy for anyone
    plus light ones, for each `h` that needs fewer moves of its own than light leases alone.

    Both parts are taken at their least, so the count stays a lower bound: the donor's own moves with its `h`
    heaviest heavy leases (fewest light ones after them), the receivers' sheds for its `h` lightest. Each heavy lease
    is charged: a donor holding two hot shards that sheds both needs two receivers (or one taking both) to shed.
    A way its light leases cannot complete is none (its own count infinite).
    """
    light = [w for w in weights if w <= room]
    heavy = sorted((w for w in weights if w > room), reverse=True)
    ways: list[Way] = [(_cover(light, excess), ())]
    for h in range(1, len(heavy) + 1):
        rest = excess - sum(heavy[:h])
        own = h + (_cover(light, rest) if rest > 0 else 0)
        if own < ways[0][0]:
            ways.append((own, tuple(heavy[-h:])))
        if rest <= 0:
            break
    return ways


def _cover(weights: list[float], needed: float) -> float:
    """`leases_to_cover`, or infinite where all of `weights` together fall short."""
    count = leases_to_cover(weights, needed)
    return count if count <= len(weights) else math.inf


def _heavy_donors(donors: list[list[Way]], sheds: Callable[[tuple[float, ...]], float]) -> float:
    """The fewest moves of donors that may each shed light leases or hand on heavy ones, receivers' sheds counted."""
    if len(donors) > GROUPED_DONORS:
        return sum(min(own + sum(min(1.0, sheds((w,))) for w in extra) for own, extra in ways) for ways in donors)
    best = math.inf
    for choice in itertools.product(*donors):
        own = sum(way[0] for way in choice)
        items = [w for _, extra in choice for w in extra]
        if own >= best:
            continue
        if len(items) > GROUPED_DONORS:
            best = min(best, own + sum(min(1.0, sheds((w,))) for w in items))
            continue
        for blocks in _partitions(list(range(len(items)))):
            best = min(best, own + sum(sheds(tuple(sorted(items[i] for i in block))) for block in blocks))
    return best


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
