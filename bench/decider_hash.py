"""A hash of every strategy's plans over seeded random fleets: two trees that print the same hash plan alike.

A refactor of coordinator/deciders/ that means to keep behaviour runs this before and after: equal hashes mean every
fleet got the same plan, moves (lease, receiver, reason, detail text), spillover, held leases, per-worker summaries,
averages, notes, fitted lines and own excess, each float by its repr (a changed last bit shows). The fleets reach what
the band model reads (6,000 of them reached every statement of coordinator/deciders/ in session 30): metric histories
with noise, own excess and failed samples, throughput histories steady and changing, `settled_reports`, the leader's
kept lines and own excess, one or two metrics or none, multi-stream keys, draining and stale workers, expired,
settling, fresh, recently moved and refused leases, leases without a figure, and varied settings (a tenth of the
fleets with a minimum gain that puts every lease's KiB/s within the noise, so the fill on shares counts leases). A
differing hash says only that something changed; `--show SEED` prints one fleet's plan to compare.

Run: `python -m bench.decider_hash [--fleets 6000] [--show SEED]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import random

from shardherd.coordinator.decide import decide
from shardherd.coordinator.decider_config import DeciderConfig, Strategy
from shardherd.coordinator.load_model import Line
from shardherd.coordinator.moves import Plan
from shardherd.coordinator.snapshot import LeaseView, Snapshot, WorkerView
from shardherd.shared.worker import FAILED_SAMPLE

KIND = ("none", "C", "C", "CM", "mixed")  # which metrics the fleet's workers report (mixed: some report none)


def _leases(rng: random.Random, wids: list[str]) -> list[LeaseView]:
    """0-60 leases, single- or multi-stream, mostly owned, with random figures and flags."""
    multi, streams, idle = rng.random() < 0.3, rng.choice([("a",), ("a", "b", "c")]), rng.random() < 0.1
    leases = []
    for i in range(rng.randint(0, 60)):
        owner = rng.choice([*wids, None]) if rng.random() < 0.15 else rng.choice(wids)
        kbps = 0.0 if idle else rng.choice([0.0, 1.0, 1024.0, rng.uniform(0, 1000), rng.uniform(0, 50),
                                             rng.paretovariate(1.2) * 20])
        leases.append(LeaseView(
            f"123456789012:{rng.choice(streams)}:1700000000:shardId-{i:012d}" if multi else f"l{i:02d}", owner,
            throughput_kbps=None if rng.random() < 0.05 else kbps,
            expired=owner is not None and rng.random() < 0.08, silent_ms=rng.randint(0, 30000),
            recently_moved=rng.random() < 0.12, settling=rng.random() < 0.08, fresh=rng.random() < 0.08,
            refused_by=frozenset(rng.sample(wids, 1)) if rng.random() < 0.05 else frozenset()))
    return leases


def _worker(rng: random.Random, wid: str, carried: float, lines: dict[str, Line]) -> WorkerView:
    """A reporting worker: each metric's line plus its own excess, with noise, a failed sample now and then."""
    n = rng.randint(1, 6)
    change = rng.choice([1.0, 1.0, 1.0, 0.5, 2.0, 0.0])  # the older half of its history carried this share of now
    history = tuple(max(0.0, carried * (change if j < n // 2 else 1.0) * (1 + rng.gauss(0, 0.05))) for j in range(n))
    own = rng.choice([0.0, 0.0, 0.0, 8.0, 25.0])
    stats, ranges = {}, {}
    for metric, line in lines.items():
        values = [max(0.0, line.base + own + line.slope * kbps + rng.gauss(0, 1.0)) for kbps in history]
        if rng.random() < 0.05:
            values[rng.randrange(n)] = FAILED_SAMPLE
        if rng.random() < 0.1:
            values[-1] += rng.choice([6.0, -6.0, 15.0])
        stats[metric], ranges[metric] = tuple(values), (rng.choice([60.0, 80.0, 100.0, 1000.0]),)
    return WorkerView(wid, stats, ranges, draining=rng.random() < 0.1, stale=rng.random() < 0.1,
                      throughput_history=history if rng.random() < 0.9 else (),
                      settled_reports=rng.choice([None, None, 0, 1, 2, 3, 6]))


def fleet(seed: int) -> tuple[Snapshot, DeciderConfig, bool]:
    """Fleet `seed`: its snapshot, the settings it is planned with and whether the run balances."""
    rng = random.Random(seed)
    wids = [f"w{i}" for i in range(rng.randint(1, 12))]
    leases = _leases(rng, wids)
    kind = rng.choice(KIND)
    truth = {"C": Line(rng.choice([0.0, 2.5, 10.0]), rng.choice([0.005, 0.02, 0.1, 0.5])),
             "M": Line(rng.choice([5.0, 30.0]), rng.choice([0.01, 0.2]))}  # the fleet's load model per metric
    workers, kept = [], {}
    for wid in wids:
        if kind == "none" or (kind == "mixed" and rng.random() < 0.3):
            workers.append(WorkerView(wid, draining=rng.random() < 0.1, stale=rng.random() < 0.1))
            continue
        carried = sum(lease.throughput_kbps or 0.0 for lease in leases if lease.lease_owner == wid)
        workers.append(_worker(rng, wid, carried, truth if kind == "CM" else {"C": truth["C"]}))
        if rng.random() < 0.15:
            kept[wid] = {"C": rng.choice([3.0, 10.0, 30.0])}
    lines = {"C": Line(rng.choice([0.0, 2.5]), rng.choice([0.005, 0.1]))} if rng.random() < 0.3 else {}
    config = DeciderConfig(
        rebalance_persistent_reports=rng.choice([1, 1, 3]),
        rebalance_fill_on_throughput=rng.random() < 0.85,
        allow_throughput_overshoot=rng.random() < 0.8,
        rebalance_dead_band_percentage=rng.choice([0.0, 2.0, 2.0, 5.0]),
        max_leases_for_worker=rng.choice([2**31 - 1, 2**31 - 1, 3, 8]),
        max_throughput_per_host_kbps=rng.choice([float("inf"), float("inf"), 2000.0]),
        allow_receiver_above_average=rng.random() < 0.8)
    balance = rng.random() < 0.85
    if rng.random() < 0.1:  # KiB/s within the noise: the fill on shares counts leases (drawn last: other fleets stay)
        config = dataclasses.replace(config, rebalance_min_gain_kbps=rng.choice([500.0, 5000.0]))
    return Snapshot.of(leases, workers, lines, kept), config, balance


def plan_text(plan: Plan) -> str:
    """Everything a plan says, floats by repr, in a fixed order."""
    return repr((plan.moves, plan.spillover, plan.held, plan.workers, sorted(plan.averages.items()), plan.notes,
                 sorted(plan.fitted.items()), sorted((w, sorted(v.items())) for w, v in plan.own_excess.items())))


def hashes(fleets: int) -> tuple[dict[str, str], int]:
    """Per strategy (and `all`), the first 16 hex digits of the hash of its plans; and the moves planned in all."""
    digests = {strategy.value: hashlib.sha256() for strategy in Strategy}
    every, moves = hashlib.sha256(), 0
    for seed in range(fleets):
        snapshot, config, balance = fleet(seed)
        for strategy in Strategy:
            plan = decide(snapshot, dataclasses.replace(config, strategy=strategy), balance=balance)
            moves += len(plan.moves)
            text = plan_text(plan).encode()
            digests[strategy.value].update(text)
            every.update(text)
    return {**{name: d.hexdigest()[:16] for name, d in digests.items()}, "all": every.hexdigest()[:16]}, moves


def main() -> None:
    """Print the hashes (or, with `--show`, one fleet's plans)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--fleets", type=int, default=6000)
    parser.add_argument("--show", type=int, default=None, metavar="SEED", help="print the plans of fleet SEED")
    args = parser.parse_args()
    if args.show is not None:
        snapshot, config, balance = fleet(args.show)
        for strategy in Strategy:
            plan = decide(snapshot, dataclasses.replace(config, strategy=strategy), balance=balance)
            print(f"{strategy.value} (balance {balance}):", *plan.moves, *plan.notes, sep="\n  ")
        return
    found, moves = hashes(args.fleets)
    for name, digest in found.items():
        print(f"{name}: {digest}")
    print(f"{args.fleets} fleets, {moves} moves")


if __name__ == "__main__":
    main()
