"""The parts of bench/ceiling.py: where a ramp ends and why, and a short ramp of the bare reader through the proxy."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

from bench.ceiling import Ramp, Step, bare_reader, ceiling, proxy_counts, run_ramp, slope, split_at_ramp, store_calls
from bench.stack_cost import read_meters
from shardherd.agent.spark.source import StoreOptions
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.config import load_settings
from shardherd.shared.store_factory import open_store
from tests.support.stores import make_store, unique_app
from tests.support.stream_stack import StreamStack


def test_the_ceiling_is_the_last_step_held_before_the_first_that_did_not() -> None:
    held = [Step(1000, 998, 990, 400, 20, 1.0), Step(2000, 1990, 1985, 1500, -30, 1.0)]
    assert ceiling(held) == (2000, "every step held")
    lagging = [*held, Step(4000, 3990, 3000, 12_000, 900, 1.0), Step(8000, 7990, 7900, 100, 0, 1.0)]
    assert ceiling(lagging) == (2000, "at 4,000/s: lag grew 900/s")
    short = [*held, Step(4000, 3000, 3000, 10, 0, 1.0, write_throttled=900)]
    assert ceiling(short) == (2000, "at 4,000/s: producer wrote 3,000/s of 4,000/s, 900 records refused by the "
                                    "write limit")
    assert ceiling([Step(1000, 500, 500, 0, 0, 1.0)])[0] == 0


def test_lag_growth_is_the_least_squares_slope_so_a_batch_sawtooth_does_not_count() -> None:
    sawtooth = [(t / 4, 1000.0 * ((t % 4) / 4)) for t in range(40)]  # a batch a second empties it: steady
    assert abs(slope(sawtooth)) < 50
    growing = [(t / 4, 300.0 * t / 4 + 1000.0 * ((t % 4) / 4)) for t in range(40)]
    assert slope(growing) == pytest.approx(300, abs=50)
    assert slope([(1.0, 5.0)]) == 0.0


def test_the_query_start_batch_is_reported_apart_from_the_ramps_batches() -> None:
    """Session 20's one run of both readers: each driver's 18.6 s batch was batch 0 (the query's start, its warm-up
    records, written before the ramp), summarised with the ramp's batches as if the ramp had stalled."""
    progress = [{"batchId": batch, "numInputRows": rows, "durationMs": {"triggerExecution": millis}}
                for batch, rows, millis in [(0, 102, 18_600), (1, 0, 300), (2, 1300, 2_200), (3, 1400, 3_300)]]
    start_up, ramp = split_at_ramp(progress, 2)
    assert [item["batchId"] for item in start_up] == [0]  # the empty batch 1 is in neither
    assert [item["batchId"] for item in ramp] == [2, 3]
    assert max(item["durationMs"]["triggerExecution"] for item in ramp) == 3_300


@pytest.mark.slow
def test_a_short_ramp_reads_what_it_writes_and_ends_at_a_shards_write_limit(moto_server: MotoServer,
                                                                          kinesalite: NodeEmulator) -> None:
    """About 10-20 s (a reason: a producer and a reader process start, spawned, and two steps of 3 s run). One shard
    behind the limits proxy: 300 records/s hold, 1,500 records/s pass its 1,000 records/s write limit."""
    context = mp.get_context("spawn")
    with KinesisLimits(kinesalite.port) as limits:
        stack = StreamStack(moto_server, limits, 1, prefix="ceiling")
        try:
            with bare_reader(context, limits.endpoint_url, stack.app) as counted:
                ramp = Ramp(context, limits.endpoint_url, stack.app, 100)
                try:
                    steps = run_ramp(ramp, counted.total, [300, 1500], 3.0, 1.0, proxy_counts(limits, stack.app))
                finally:
                    ramp.stop()
        finally:
            stack.close()
    assert [step.rate for step in steps] == [300, 1500]
    assert steps[0].written >= 270 and steps[0].lag <= 300  # held: records read within a second
    assert 700 <= steps[1].written <= 1100 and steps[1].write_throttled > 0  # the shard's write limit
    assert 0 < steps[0].calls_per_shard <= 5  # the bare reader's calls, counted by the proxy within its read limit
    assert ceiling(steps)[0] == 300
    assert counted.throttled == 0  # the bare reader's calls stay under the read limit


def test_store_calls_are_metered_in_every_process_including_executors_by_caller_table_and_key_kind(
        moto_server: MotoServer, tmp_path: Path) -> None:
    """`--count-store`: the executors' store (opened as the source opens it) and an agent's in the same process each
    write their own report, and the bench counts them apart by caller, table and coordinator-state key prefix."""
    app = unique_app("meter")
    make_store("dynamodb", moto_url=moto_server.endpoint_url, app=app).ensure_tables()
    executor = StoreOptions(app, "dynamodb", moto_server.endpoint_url, str(tmp_path)).open("us-east-1")
    agents = [open_store(load_settings(application_name=app, dynamodb_endpoint_url=moto_server.endpoint_url,
                                       store_meter_dir=str(tmp_path)), caller="agent") for _ in range(2)]
    assert executor.put_state("spark-end/t1", {"n": 1})
    assert executor.get_state("spark-end/t1") == {"n": 1}
    for store in agents:
        assert store.get_lease("shard-0") is None
    for store in (executor, *agents):
        store.close()  # writes its last report
    assert len(list(tmp_path.glob("*.json"))) == 3
    assert store_calls(read_meters(tmp_path)) == {"executor state put spark-end": 1, "executor state get spark-end": 1,
                                                  "agent leases get_lease": 2}
