"""The simulator's steady-state scenario reproduces the live stack's CPU churn and the persistence rule ends it
(bench/fleet_noise.py; decision 0013)."""

from __future__ import annotations

from bench.fleet.noise import PLAIN_DELIVERY, NoiseModel
from bench.fleet.worker import CpuModel
from bench.fleet_noise import LOCAL_CPU, run_steady


def test_cpu_excursions_moved_leases_when_only_the_newest_report_counted_and_move_none_now() -> None:
    # The local stack's fleet with CPU metrics on and the live agents' CPU (a few excursions per agent and 10
    # minutes): balanced on the newest report alone, seed 7 moves leases three times in 10 minutes (live: 0-2).
    model = NoiseModel(PLAIN_DELIVERY)
    before = run_steady(7, model, LOCAL_CPU, settings={"rebalance_persistence_millis": 0})
    assert before.moves > 0
    assert run_steady(7, model, LOCAL_CPU).moves == 0
    # Without excursions nothing moves either way: the churn comes from the CPU excursions, not the throughput noise.
    calm = CpuModel(base=LOCAL_CPU.base, mean_at_start=LOCAL_CPU.mean_at_start, sample_sd=LOCAL_CPU.sample_sd)
    assert run_steady(7, model, calm, settings={"rebalance_persistence_millis": 0}).moves == 0
