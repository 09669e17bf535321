"""The cost bench meters every caller of a small simulated fleet and prices KCL on the same table, so it cannot rot."""

from __future__ import annotations

import pytest

from bench.fleet_cost import exponent, run_size
from bench.kcl_baseline import RENEW_S, kcl_bill
from shardherd.coordinator.leader_lock import LOCK_ITEM_BYTES
from shardherd.services.leader_status import MAX_STATUS_BYTES
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.lease import Lease


def test_a_small_fleet_is_metered_by_caller_and_compared_with_kcl() -> None:
    # Warm-up covers balancing's convergence and its rate-limited publication (one per 10 s after a burst of 3).
    # Once quiet, the leader balances at each full scan (20 s, decision 0010), so the fleet settles later than the
    # 40 s it took when every 2 s run scanned.
    result = run_size(8, 3, warmup=120.0, window=30.0)
    callers = {caller: result.per_minute(caller) for caller in ("leader", "lock", "agent", "api", "metrics")}
    assert all(callers[caller].requests > 0 for caller in ("leader", "lock", "agent")), callers
    # Scrapes are served by the leader replica from memory (decision 0012), reading at most the lock and the status
    # (0.5 units) when the cache period has passed. The dashboard's refresh (a reader here: no token is configured)
    # reads both tables once the leader's view is older than api_cache_millis, so its checkpoint ages are true to 2 s
    # (issue 33, docs/store-cost.md): at most one scan of each small table per refresh, 20 refreshes a minute.
    assert callers["api"].read_units <= 20 * 1.0, callers
    assert callers["metrics"].read_units <= 4 * 1.0, callers
    assert callers["agent"].write_units >= 3 * 60 / 3.4  # every worker heartbeats about every 3.3 s
    assert callers["lock"].write_units == pytest.approx(40, rel=0.1)  # a heartbeat every 1.5 s
    assert result.status_sizes and max(result.status_sizes) <= MAX_STATUS_BYTES
    assert result.lock_sizes and max(result.lock_sizes) <= LOCK_ITEM_BYTES  # the sightings ride within one unit
    assert result.per_minute("status").write_units == 0  # steady state: nothing changed, nothing published
    kcl = {line.what: line for line in result.kcl}
    assert kcl["renew every lease"].write_units == pytest.approx(8 * 60 / RENEW_S)
    assert result.kcl_totals().write_units > result.totals().write_units
    full = [run for run in result.runs if run.reason is not None]
    assert full and all(run.scan_s > 0 for run in full)
    assert all(run.scan_s == 0 for run in result.runs if run.reason is None)


def test_kcl_reads_grow_with_the_table_and_exponents_fit_power_laws() -> None:
    def reads(shards: int) -> float:
        leases = [Lease(lease_key=f"shardId-{i:012d}", checkpoint=Checkpoint.at(10**20 + i)) for i in range(shards)]
        return sum(line.read_units for line in kcl_bill(leases, ["w1", "w2"], 1.0))

    assert reads(4000) > reads(1000) > 0
    assert exponent([(10, 3 * 10**1.5), (100, 3 * 100**1.5), (1000, 3 * 1000**1.5)]) == pytest.approx(1.5)
