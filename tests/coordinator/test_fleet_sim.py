"""The fleet simulator's quick cold-start and crash scenarios keep their invariants, so the bench cannot rot."""

from __future__ import annotations

import random
import statistics

import pytest

from bench.fleet.measures import greedy_moves, minimum_moves, within_bound
from bench.fleet.model import KCL2, LEASE_COUNT, VARIANCE, VARIANCE_KCL, Fleet
from bench.fleet.scenarios import QUICK, Result, run_scenario, run_variant, scenarios
from bench.fleet.worker import AgentWorker
from bench.fleet.world import Stream
from bench.kcl2_taker import Kcl2Taker
from bench.store_counter import WRITE_KINDS, CountingStore
from shardherd.shared.clock import ManualClock
from shardherd.shared.lease import Lease
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.store import LeaseStore, TableNames
from shardherd.shared.store_meter import StoreMeter
from shardherd.shared.worker import WorkerState
from tests.support.stores import worker_record


def _run(name: str) -> dict[str, Result]:
    scenario = next(s for s in scenarios(QUICK) if s.name == name)
    return {r.variant.split("/")[0]: r for r in run_scenario(scenario, QUICK, seed=11, zipf=0.5)}


@pytest.mark.parametrize("name", ["cold-start", "crash"])
def test_every_lease_ends_on_a_live_worker_and_moves_cover_the_forced_ones(name: str) -> None:
    results = _run(name)
    assert set(results) == {VARIANCE, VARIANCE_KCL, LEASE_COUNT, KCL2}
    for variant, result in results.items():
        assert (result.unowned, result.dead_owned, result.missing) == (0, 0, 0), variant
        assert result.forced > 0
        assert result.moves >= result.forced, variant
        assert result.total_per_minute(WRITE_KINDS) > 0


def test_cold_start_must_place_every_shard_and_the_leader_does_it_in_its_first_run() -> None:
    results = _run("cold-start")
    for result in results.values():
        assert result.forced == QUICK.shards
    variance = results[VARIANCE]
    assert variance.counts["create"] == QUICK.shards
    assert variance.counts["assign"] >= QUICK.shards  # unowned leases get plain (fenced) assignments
    assert variance.lease_counts[0] >= 1  # every worker got something
    assert results[KCL2].moves > QUICK.shards  # KCL 2.x: the first taker grabs everything, the others steal back


def test_crashed_workers_leases_move_by_plain_assignment_or_kcl2_takes() -> None:
    results = _run("crash")
    assert results[VARIANCE].counts.get("assign", 0) >= results[VARIANCE].forced
    assert results[KCL2].counts.get("assign", 0) >= results[KCL2].forced  # the model's takes (bench/kcl2_taker.py)


def test_band_balancing_settles_a_scale_out_in_fewer_balancing_runs_than_kcl_budgets() -> None:
    results = _run("scale-out+2")
    band, kcl = results[VARIANCE], results[VARIANCE_KCL]
    assert band.cpu.balancing_runs is not None and band.cpu.final <= 1.10
    assert kcl.cpu.balancing_runs is None or band.cpu.balancing_runs <= kcl.cpu.balancing_runs
    assert (band.unowned, band.dead_owned) == (0, 0)


def test_hot_shards_settle_near_the_minimum_moves_over_seeds() -> None:
    # fleet_sim --quick hot shards (issue 31's target over seeds, not one): the median run moves at most 1.25x the
    # minimum, none takes over 3 balancing runs, and every run ends with its CPU spread within the bound (1.1x the
    # mean) or just above it (seeds 7-18 end 2 or 3 of 12 runs at 1.108-1.119 and move nothing more; a single seed
    # decided the old form of this test).
    scenario = next(s for s in scenarios(QUICK) if s.name.startswith("hot-shards"))
    results = [run_variant(scenario, VARIANCE, "worker", QUICK, seed=seed, zipf=0.5, report_seconds=None)
               for seed in range(7, 15)]
    assert statistics.median(result.moves / max(1, result.minimum) for result in results) <= 1.25, results
    for result in results:
        assert result.cpu.within or result.cpu.final <= 1.12, result
        assert result.cpu.balancing_runs is None or result.cpu.balancing_runs <= 3, result


def test_balance_bound_lets_a_worker_carry_one_shard_heavier_than_the_mean() -> None:
    # Shards of 1024, 512 and 341 KiB/s (Zipf exponent 1) on two workers: mean 938.5 is below the 1024 shard, so its
    # holder may carry up to 1.1 x 1024 = 1126.4, the other worker up to 1.1 x 938.5 = 1032.4.
    stream = Stream.zipf(3, 1.0, random.Random(3))
    fleet = Fleet(VARIANCE, "worker", stream, seed=1)
    fleet.add_workers(2)
    heavy, medium, light = sorted(stream.kbps, key=lambda k: -stream.kbps[k])
    for key in (heavy, medium, light):
        fleet.store.create_lease(Lease(key))
    fleet.store.assign(heavy, "w0000", None, None)
    fleet.store.assign(medium, "w0001", None, None)
    fleet.store.assign(light, "w0001", None, None)
    assert within_bound(fleet, "tp")  # 1024 and 853
    fleet.store.assign(medium, "w0000", "w0001", None)
    assert not within_bound(fleet, "tp")  # 1536 > 1126.4
    # w0001 (341) can take at most 1032.4 - 341 = 691.4: the 1024 shard would cost a second move, the 512 one fits.
    assert minimum_moves(fleet) == (0, 1)
    # The offline greedy moves the lease nearest half the gap (1536 - 341 = 1195): the 512 one, and is done.
    assert greedy_moves(fleet) == (1, True)


def test_a_heavy_lease_counts_every_lease_its_receiver_must_shed() -> None:
    # w0000 carries 600 + 6 x 50 = 900 KiB/s, w0001 and w0002 3 x 150 + 50 = 500 each: mean 633.3, bound 696.7.
    # w0000 must lose 203.3: five 50s (light, each fits anywhere), or the 600, which no worker takes within the bound:
    # its receiver (1,100) must shed 403.3, three 150s: 4 moves (the 150s go to w0000 twice and to the other once).
    # The counting bound used to charge the heavy lease one receiver shed (2 moves), which no plan reaches.
    fleet = Fleet(VARIANCE, "worker", Stream.tiled([600.0] + [50.0] * 6 + [150.0, 150.0, 150.0, 50.0] * 2), seed=1)
    fleet.add_workers(3)
    keys = sorted(fleet.stream.kbps)
    owners = ["w0000"] * 7 + ["w0001"] * 4 + ["w0002"] * 4
    for key, owner in zip(keys, owners, strict=True):
        fleet.store.create_lease(Lease(key))
        fleet.store.assign(key, owner, None, None)
    assert minimum_moves(fleet) == (0, 4)
    assert greedy_moves(fleet) == (5, True)  # the five 50s


def test_each_heavy_lease_a_donor_must_shed_costs_its_own_receiver_sheds() -> None:
    # w0000 holds three 600 KiB/s shards, the others 3 x 150 + 50 = 500 each: mean 825, bound 907.5. w0000 must lose
    # 892.5, two of its shards; nobody can take one within the bound (500 + 600 > 907.5), so each receiver sheds two
    # 150s (one receiver cannot take both: 1,700): 2 + 2 + 2 moves. The bound charged only the lightest heavy lease,
    # and with no light lease to fall back on, counted a single move (fleet_sim, hot shards, full size, seed 8).
    fleet = Fleet(VARIANCE, "worker", Stream.tiled([600.0] * 3 + [150.0, 150.0, 150.0, 50.0] * 3), seed=1)
    fleet.add_workers(4)
    owners = ["w0000"] * 3 + ["w0001"] * 4 + ["w0002"] * 4 + ["w0003"] * 4
    for key, owner in zip(sorted(fleet.stream.kbps), owners, strict=True):
        fleet.store.create_lease(Lease(key))
        fleet.store.assign(key, owner, None, None)
    assert minimum_moves(fleet) == (0, 6)
    assert greedy_moves(fleet) == (6, True)


def test_a_crashed_workers_lease_too_heavy_for_every_survivor_costs_its_receiver_a_shed() -> None:
    # Shards of 1024, 512 and 341 KiB/s; w0000 (holding the 1024 shard) crashes. The survivors' mean is 938.5, so
    # whoever takes the 1024 shard may carry 1.1 x 1024 = 1126.4: w0002 (341) would carry 1365, w0001 (512) 1536.
    # The shard costs its own move and a shed of its receiver (fleet_sim crash seed 9 and scale-in seed 12: the
    # decider and the offline greedy both made forced + 1 moves against a minimum of forced alone).
    stream = Stream.zipf(3, 1.0, random.Random(3))
    fleet = Fleet(VARIANCE, "worker", stream, seed=1)
    fleet.add_workers(3)
    heavy, medium, light = sorted(stream.kbps, key=lambda k: -stream.kbps[k])
    for key, owner in ((heavy, "w0000"), (medium, "w0001"), (light, "w0002")):
        fleet.store.create_lease(Lease(key))
        fleet.store.assign(key, owner, None, None)
    assert minimum_moves(fleet) == (0, 0)
    fleet.workers["w0000"].crash()
    assert minimum_moves(fleet) == (1, 1)
    assert greedy_moves(fleet) == (2, True)  # 1024 to w0002, which gives its 341 to w0001


def test_counting_store_counts_scan_pages_and_writes_by_kind() -> None:
    store = CountingStore(MemoryLeaseStore(TableNames.for_application("count")))
    for index in range(25):
        store.create_lease(Lease(f"shard-{index:03d}"))
    assert len(store.scan_leases(page_size=10).leases) == 25
    store.assign("shard-000", "w1", None, None)
    store.list_owned_keys("w1")
    assert (store.counts["create"], store.counts["scan_page"], store.counts["assign"], store.counts["gsi_query"]) == (
        25, 3, 1, 1)
    assert store.writes() == 26 and store.reads() == 4


def test_kcl2_taker_grabs_every_never_renewed_lease_then_a_newcomer_steals_one_at_a_time() -> None:
    memory = MemoryLeaseStore(TableNames.for_application("taker"))
    clock = ManualClock()
    for index in range(6):
        memory.create_lease(Lease(f"shard-{index}"))
    first = Kcl2Taker("a", memory, clock, 10.0, random.Random(1))
    assert len(first.take_leases()) == 6  # very old (never renewed) leases are all taken, ignoring the target
    second = Kcl2Taker("b", memory, clock, 10.0, random.Random(2))
    for held in (1, 2):  # a's leases look freshly renewed (first sighting), so b steals, one per pass
        stolen = second.take_leases()
        assert len(stolen) == 1 and stolen[0].lease_owner == "b"
        assert len(memory.list_owned_keys("b")) == held
    clock.advance(11.0)  # nobody renewed: owners of expired leases are invisible, so b alone targets all 6
    assert len(second.take_leases()) == 6
    assert len(memory.list_owned_keys("b")) == 6


def test_simulated_agents_run_the_agent_keeper_a_drain_is_announced_at_once_and_the_row_retired() -> None:
    fleet = Fleet(VARIANCE, "worker", Stream.zipf(6, 0.5, random.Random(2)), seed=3)
    fleet.calibrate(2)
    fleet.add_workers(2)
    fleet.events.run_until(40.0)
    leaving = fleet.workers["w0001"]
    assert isinstance(leaving, AgentWorker) and leaving.keeper.held()  # leases reached it through its keeper
    row = worker_record(fleet.inner, "w0001")
    assert row is not None and row.state is WorkerState.ACTIVE and set(row.lease_throughput) == set(leaving.processing)
    leaving.scale_in()
    fleet.events.run_until(fleet.events.now())  # the keeper's next tick is due at once
    row = worker_record(fleet.inner, "w0001")
    assert row is not None and row.state is WorkerState.DRAINING
    fleet.events.run_until(80.0)
    assert not leaving.alive and worker_record(fleet.inner, "w0001") is None  # handed everything on, then retired
    assert {lease.actual_owner for lease in fleet.leases()} == {"w0000"}


@pytest.mark.parametrize("write_seconds", [0.0, 0.5])
def test_a_leaders_timed_writes_land_lane_round_by_round_while_the_fleet_runs_on(write_seconds: float) -> None:
    meters: list[StoreMeter] = []

    def wrap(inner: LeaseStore) -> LeaseStore:
        meters.append(StoreMeter(inner, default_caller="agent"))
        return meters[-1]

    fleet = Fleet(VARIANCE, "worker", Stream.tiled([0.1] * 32), 7, wrap_store=wrap, write_seconds=write_seconds)
    fleet.add_workers(3)
    seen: list[tuple[float, int]] = []  # (time, leases owned) every 0.1 s

    def look() -> bool:
        seen.append((fleet.events.now(), sum(1 for lease in fleet.leases() if lease.actual_owner)))
        return True

    fleet.events.every(0.0, 0.1, look)
    fleet.events.run_until(30.0)
    counts = {owned for _, owned in seen}
    assert max(counts) == 32
    if write_seconds == 0:
        assert counts == {0, 32}  # every write lands at the instant the run starts
        return
    # 32 writes on 8 lanes: 8 land every 0.5 s, and the fleet's other events (these looks) run between them
    assert {8, 16, 24} <= counts, seen
    first, last = (min(at for at, owned in seen if owned >= n) for n in (8, 32))
    assert 1.5 - 0.1 <= last - first <= 1.5 + 0.1, seen
    # The agents' calls made while the leader waited (finding their leases: owner-index queries, lease reads) are
    # theirs: the leader's own are its scans, its shard sync's creates and its assignments.
    leader = {(row.table, row.operation) for row in meters[0].rows() if row.caller == "leader"}
    assert {operation for _, operation in leader} == {"scan", "create", "assign"}, leader
