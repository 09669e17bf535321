"""Time one decider pass at 1k/10k leases x 100/1k workers with Zipf shard throughput (seeded).

Prints median and p95 milliseconds per pass for each strategy: `band` (the default), `kcl-variance` (KCL's dampened
budgets) and `lease-count`, and each one's median over `kcl-variance`'s median on the same snapshot in the same run
(the baseline: KCL's reference strategy). The strategies take turns, one pass each, so a shared host's load falls on
all of them alike. Targets (issue 31): band <= 50 ms median and <= 100 ms p95 at 10,000 leases
x 1,000 and x 100 workers, and at most 1.5 x kcl-variance. The snapshot is a random assignment (every worker far from
its share), so balancing moves hundreds of leases in one pass.
Run: `python -m bench.decider [--repeat N]`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial

from shardherd.coordinator.decide import decide
from shardherd.coordinator.decider_config import DeciderConfig, Strategy
from shardherd.coordinator.snapshot import LeaseView, Snapshot, WorkerView

SIZES = [(1_000, 100), (1_000, 1_000), (10_000, 100), (10_000, 1_000)]


def build(n_leases: int, n_workers: int, seed: int = 42) -> Snapshot:
    """A steady-state fleet: Zipf(1.1) shard throughput, random owners, CPU proportional to carried throughput,
    2 % of leases expired and 1 % unassigned, one draining worker."""
    rng = random.Random(seed)
    ranks = list(range(1, n_leases + 1))
    rng.shuffle(ranks)
    kbps = [1000.0 / r**1.1 for r in ranks]
    workers = [f"w{i:05d}" for i in range(n_workers)]
    carried = dict.fromkeys(workers, 0.0)
    leases = []
    for i, tp in enumerate(kbps):
        roll = rng.random()
        owner = None if roll < 0.01 else rng.choice(workers)
        if owner is not None:
            carried[owner] += tp
        leases.append(
            LeaseView(
                f"shardId-{i:012d}",
                owner,
                throughput_kbps=tp,
                expired=owner is not None and roll < 0.03,
                silent_ms=rng.randrange(0, 60_000),
            )
        )
    mean_share = sum(kbps) / n_workers
    views = []
    for i, wid in enumerate(workers):
        cpu = 10 + 60 * carried[wid] / mean_share
        history = tuple(max(0.0, cpu + rng.gauss(0, 2)) for _ in range(10))
        views.append(WorkerView(wid, {"C": history}, {"C": (100.0,)}, draining=i == 0))
    return Snapshot.of(leases, views)


def timed(actions: Sequence[Callable[[], object]], repeat: int) -> list[list[float]]:
    """Wall times of `repeat` calls of each action, in milliseconds; the actions take turns."""
    out: list[list[float]] = [[] for _ in actions]
    for _ in range(repeat):
        for action, times in zip(actions, out, strict=True):
            start = time.perf_counter()
            action()
            times.append((time.perf_counter() - start) * 1000.0)
    return out


def p95(samples: list[float]) -> float:
    """The 95th percentile (nearest rank)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    """Run every size for each strategy and print one line each."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    header = ("strategy", "leases", "workers", "median ms", "p95 ms", "x kcl-var", "moves")
    print(f"{header[0]:<12}" + "".join(f"{h:>{w}}" for h, w in zip(header[1:], (8, 9, 11, 9, 10, 7), strict=True)))
    rows: list[tuple[str, int, int, float, float, int]] = []
    baseline: dict[tuple[int, int], float] = {}
    for n_leases, n_workers in SIZES:
        snapshot = build(n_leases, n_workers)
        configs = [DeciderConfig(strategy=strategy) for strategy in Strategy]
        times = timed([partial(decide, snapshot, config, True) for config in configs], args.repeat)
        for strategy, config, runs in zip(Strategy, configs, times, strict=True):
            moves = len(decide(snapshot, config, balance=True).moves)
            if strategy is Strategy.KCL_VARIANCE:
                baseline[(n_leases, n_workers)] = statistics.median(runs)
            rows.append((strategy.value, n_leases, n_workers, statistics.median(runs), p95(runs), moves))
    for name, n_leases, n_workers, median, slow, moves in sorted(rows, key=lambda r: r[0]):
        ratio = median / baseline[(n_leases, n_workers)]
        print(f"{name:<12}{n_leases:>8}{n_workers:>9}{median:>11.2f}{slow:>9.2f}{ratio:>10.2f}{moves:>7}")

if __name__ == "__main__":
    main()
