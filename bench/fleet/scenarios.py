"""The benchmark's scenarios (cold start, scale out/in, crash, hot shards, idle stream, cost) and their results."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.fleet.measures import greedy_moves, lpt_ratio, minimum_moves, ratio, within_bound
from bench.fleet.model import KCL2, LEASE_COUNT, VARIANCE, VARIANCE_KCL, Fleet
from bench.fleet.noise import LiveNoise, NoiseModel
from bench.fleet.world import PEAK_SHARD_KBPS, Stream
from bench.kcl2_taker import taker_interval_seconds


@dataclass(frozen=True, slots=True)
class Size:
    """Fleet sizes and durations of one run of the benchmark."""

    shards: int
    workers: int
    change: int  # workers added, drained, or shards made hot
    big_shards: int
    big_workers: int
    cost_shards: int
    cost_workers: int
    warmup: float
    observe: float


FULL = Size(200, 20, 5, 500, 100, 1000, 50, 300.0, 300.0)
QUICK = Size(48, 8, 2, 100, 20, 1000, 50, 160.0, 160.0)


@dataclass(frozen=True, slots=True)
class Balance:
    """How one load measure evolved from the event on.

    `runs`: leader runs (kcl2: taker rounds) until the fleet became balanced (`within_bound`, every lease on a live
    worker) for good; None if it was not balanced at the end. `balancing_runs`: how many of those leader runs were
    balancing runs. `final`: max/mean at the end; `within`: whether the end state is within the bound.
    """

    runs: int | None
    balancing_runs: int | None
    seconds: float | None
    final: float
    within: bool


@dataclass
class Result:
    """What one variant did in one scenario, measured from the event on.

    `moves`: changes of a lease's actual owner to another worker (an unowned lease getting an owner counts; a
    handoff counts once, when it completes). `forced`, `minimum` (= forced + shed): see `minimum_moves`, on carried
    throughput; where the offline greedy reached the bound with fewer moves, its count is the minimum.
    `cpu_minimum`: the same on the modelled CPU, the measure the decider balances (its bound is looser: every
    worker also carries the model's base); the greedy's count applies to it too (a fleet balanced on throughput is
    balanced on the modelled CPU).
    `cpu`, `tp`: balance judged on the modelled CPU and on carried throughput (see `Balance`). `greedy`: moves of
    an offline greedy with exact loads from the same state, and whether it reached the bound (`greedy_moves`).
    """

    scenario: str
    variant: str
    moves: int
    forced: int
    minimum: int
    cpu_minimum: int
    cpu: Balance
    tp: Balance
    lpt_ratio: float
    split: tuple[int, int]
    lease_counts: tuple[int, int]
    minutes: float
    counts: dict[str, int]
    greedy: tuple[int, bool] | None
    unowned: int
    dead_owned: int
    missing: int

    def per_minute(self, kinds: Sequence[str]) -> dict[str, float]:
        """Requests per minute of the given kinds (only those that occurred)."""
        return {k: self.counts[k] / self.minutes for k in kinds if self.counts.get(k)}

    def total_per_minute(self, kinds: Sequence[str]) -> float:
        """All requests of the given kinds per minute."""
        return sum(self.per_minute(kinds).values())


Event = Callable[[Fleet], None]  # applies the scenario's change


def _scale_out(count: int) -> Event:
    def apply(fleet: Fleet) -> None:
        fleet.add_workers(count)

    return apply


def _scale_in(count: int) -> Event:
    def apply(fleet: Fleet) -> None:
        for wid in fleet.live()[-count:]:
            fleet.workers[wid].scale_in()

    return apply


def _crash(fleet: Fleet) -> None:
    fleet.workers[fleet.live()[0]].crash()


def _hot(count: int) -> Event:
    def apply(fleet: Fleet) -> None:
        keys = sorted(fleet.stream.kbps, key=lambda k: (fleet.stream.kbps[k], k))
        chosen = random.Random(fleet.seed + 1).sample(keys[: len(keys) // 2], count)  # quiet shards turn hot
        for key in chosen:
            fleet.stream.kbps[key] = PEAK_SHARD_KBPS

    return apply


def _idle(fleet: Fleet) -> None:
    for key in fleet.stream.kbps:
        fleet.stream.kbps[key] = 0.0


def _nothing(fleet: Fleet) -> None:
    """No change: the scenario measures what happens from the start (cold start) or in steady state (cost)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """A fleet, an optional warm-up, an event, and an observation window."""

    name: str
    shards: int
    workers: int
    event: Event
    warmup: bool
    modes: tuple[tuple[str, str], ...] = ((VARIANCE, "worker"), (VARIANCE_KCL, "worker"), (LEASE_COUNT, "worker"),
                                          (KCL2, "kcl2"))
    checkpoint_seconds: float = 0.0


def scenarios(size: Size) -> list[Scenario]:
    """Every scenario at the given size."""
    n, w, k = size.shards, size.workers, size.change
    cost_modes = ((VARIANCE, "worker"), (VARIANCE, "lease"), (KCL2, "kcl2"))
    return [
        Scenario("cold-start", n, w, _nothing, warmup=False),
        Scenario(f"scale-out+{k}", n, w, _scale_out(k), warmup=True),
        Scenario(f"scale-in-{k}", n, w, _scale_in(k), warmup=True),
        Scenario("crash", n, w, _crash, warmup=True),
        Scenario(f"hot-shards-{k}", n, w, _hot(k), warmup=True),
        Scenario("idle-stream", n, w, _idle, warmup=True),
        Scenario(f"{size.big_shards}sh-{size.big_workers}+{size.big_workers}w", size.big_shards, size.big_workers,
                 _scale_out(size.big_workers), warmup=True),
        Scenario(f"cost-{size.cost_shards}sh-{size.cost_workers}w", size.cost_shards, size.cost_workers, _nothing,
                 warmup=True, modes=cost_modes),
        Scenario(f"cost-{size.cost_shards}sh-{size.cost_workers}w-ckpt60s", size.cost_shards, size.cost_workers,
                 _nothing, warmup=True, modes=cost_modes, checkpoint_seconds=60.0),
    ]


def run_variant(scenario: Scenario, variant: str, mode: str, size: Size, seed: int, zipf: float,
                report_seconds: float | None, noise: NoiseModel | None = None) -> Result:
    """Run one variant of a scenario and measure it from the event on (with the live stack's noise if given)."""
    stream = Stream.zipf(scenario.shards, zipf, random.Random(seed))
    fleet = Fleet(variant, mode, stream, seed, report_seconds, scenario.checkpoint_seconds,
                  noise=None if noise is None else LiveNoise(noise, seed))
    fleet.calibrate(scenario.workers)
    fleet.add_workers(scenario.workers)
    if scenario.warmup:
        fleet.events.run_until(size.warmup)
    original = set(fleet.workers)
    scenario.event(fleet)
    start = fleet.events.now()
    forced, shed = (len(fleet.stream.shards), 0) if not scenario.warmup else minimum_moves(fleet)
    cpu_shed = 0 if not scenario.warmup else minimum_moves(fleet, "cpu")[1]
    greedy = greedy_moves(fleet) if scenario.warmup else None
    fleet.store.reset()
    fleet.moves.moves = 0
    since: dict[str, float | None] = {"cpu": None, "tp": None}
    step = fleet.settings.lease_assignment_interval_millis / 1000
    end = start + size.observe
    t = start
    while t < end:
        t = min(end, t + step)
        fleet.events.run_until(t)
        placed = not _unplaced(fleet)
        for metric, first in since.items():
            balanced = placed and within_bound(fleet, metric)
            since[metric] = (first if first is not None else t) if balanced else None
    balances = {metric: _balance(fleet, metric, start, first) for metric, first in since.items()}
    return _result(scenario, fleet, start, (forced, shed, cpu_shed), balances, original, greedy)


def _unplaced(fleet: Fleet) -> bool:
    live = set(fleet.live())
    return any(lease.actual_owner not in live for lease in fleet.leases())


def _balance(fleet: Fleet, metric: str, start: float, balanced_since: float | None) -> Balance:
    runs = balancing = seconds = None
    if balanced_since is not None:
        seconds = balanced_since - start
        if fleet.variant == KCL2:
            runs = math.ceil(seconds / taker_interval_seconds(fleet.timing.failover, fleet.timing.epsilon))
        else:
            # Counted from the leader's first reaction (its first move after the event): before it, a crashed
            # worker's leases are not expired yet and a new worker has not reported, so no decider could act.
            reaction = next((r[0] for r in fleet.runs if r[0] >= start and r[2]), start)
            until = [r for r in fleet.runs if reaction <= r[0] <= balanced_since]
            runs, balancing = len(until), sum(1 for r in until if r[1])
    return Balance(runs, balancing, seconds, ratio(fleet.loads(metric)), within_bound(fleet, metric))


def _result(scenario: Scenario, fleet: Fleet, start: float, minimum: tuple[int, int, int], balances: dict[str, Balance],
            original: set[str], greedy: tuple[int, bool] | None) -> Result:
    leases = fleet.leases()
    per_worker = _per_worker(fleet)
    weights = [fleet.stream.kbps.get(lease.lease_key, 0.0) if fleet.stream.total() > 0 else 1.0 for lease in leases]
    return Result(
        scenario=scenario.name, variant=f"{fleet.variant}/{fleet.mode}", moves=fleet.moves.moves, forced=minimum[0],
        # The counting bound is not a true lower bound once a shard outweighs the mean (moving it raises its
        # receiver's allowance), so an achieved greedy count below it replaces it.
        minimum=_lowest(minimum[0] + minimum[1], greedy), cpu_minimum=_lowest(minimum[0] + minimum[2], greedy),
        cpu=balances["cpu"], tp=balances["tp"], lpt_ratio=lpt_ratio(weights, len(per_worker)),
        split=(sum(n for w, n in per_worker.items() if w in original),
               sum(n for w, n in per_worker.items() if w not in original)),
        lease_counts=(min(per_worker.values(), default=0), max(per_worker.values(), default=0)),
        minutes=(fleet.events.now() - start) / 60, counts=dict(fleet.store.counts),
        greedy=greedy, **_left_over(fleet),
    )


def _left_over(fleet: Fleet) -> dict[str, int]:
    """Leases nobody owns, leases owned by dead workers, and shards without a lease."""
    leases = fleet.leases()
    alive = {w.worker_id for w in fleet.workers.values() if w.alive}
    return {"unowned": sum(1 for lease in leases if lease.actual_owner is None),
            "dead_owned": sum(1 for lease in leases if lease.actual_owner is not None
                              and lease.actual_owner not in alive),
            "missing": len({s.shard_id for s in fleet.stream.shards} - {lease.lease_key for lease in leases})}


def _per_worker(fleet: Fleet) -> dict[str, int]:
    """Leases held by each live worker."""
    per_worker: dict[str, int] = dict.fromkeys(fleet.live(), 0)
    for lease in fleet.leases():
        if lease.actual_owner in per_worker:
            per_worker[lease.actual_owner] += 1
    return per_worker


def _lowest(bound: int, greedy: tuple[int, bool] | None) -> int:
    """The counting bound, or the greedy's count where it reached the bound with fewer moves."""
    return min(bound, greedy[0]) if greedy is not None and greedy[1] else bound


def run_scenario(scenario: Scenario, size: Size, seed: int, zipf: float,
                 report_seconds: float | None = None, noise: NoiseModel | None = None) -> list[Result]:
    """Every variant of one scenario, same seed."""
    return [run_variant(scenario, variant, mode, size, seed, zipf, report_seconds, noise)
            for variant, mode in scenario.modes]
