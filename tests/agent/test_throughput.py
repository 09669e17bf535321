"""Per-lease throughput: KiB/s of the data arriving in the shard over a window of arrival times, EMA alpha 0.5,
maturity of a new owner's figure, read bursts (handoff backlog, Spark batches), seeding, idle decay, thread safety."""

from __future__ import annotations

import math
import threading

import pytest

from shardherd.agent.metrics import InvalidMetricInput
from shardherd.agent.metrics.throughput import ThroughputRecorder
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings

MIB = 1024 * 1024
GIB = 1024 * MIB
KIB = 1024


def recorder(window: float = 60.0) -> tuple[ThroughputRecorder, ManualClock]:
    clock = ManualClock()
    return ThroughputRecorder(clock, window_seconds=window), clock


def steady(stats: ThroughputRecorder, clock: ManualClock, key: str, kib_per_second: float, seconds: int) -> None:
    """Records arriving at a steady rate, each second's read right after it (arrival times = that second)."""
    for _ in range(seconds):
        clock.advance(1.0)
        stats.record(key, int(kib_per_second * KIB), clock.time() - 1.0, clock.time())


def test_kcl_anchor_five_mib_in_a_minute() -> None:
    stats, clock = recorder()
    stats.track("shardId-000")
    clock.advance(60.0)
    for _ in range(5):
        stats.record("shardId-000", MIB, clock.time() - 60.0, clock.time())
    # 5 x 1024 KiB arrived over the last 60 s = 85.3333... KiB/s, first value as is, 6 decimals.
    assert stats.compute("shardId-000") == 85.333333
    assert stats.compute("shardId-000") == 85.333333  # reading again changes nothing


def test_kcl_anchor_a_thousand_gib() -> None:
    stats, clock = recorder()
    stats.track("s")
    clock.advance(60.0)
    for _ in range(1000):
        stats.record("s", GIB, clock.time() - 60.0, clock.time())
    # 1000 x 1048576 KiB / 60 s = 17 476 266.666... KiB/s.
    assert stats.compute("s") == 17_476_266.666667


def test_for_settings_uses_the_configured_window() -> None:
    settings = load_settings(lease_throughput_window_millis=12_000, worker_metrics_ema_alpha=0.25)
    assert ThroughputRecorder.for_settings(ManualClock(), settings).window_seconds == 12.0


def test_a_new_owner_reports_nothing_before_half_a_window_unless_seeded() -> None:
    stats, clock = recorder(window=30.0)
    stats.track("s")
    steady(stats, clock, "s", 2.0, 14)
    assert stats.compute("s") is None  # 14 s covered: the leader keeps the previous owner's figure meanwhile
    steady(stats, clock, "s", 2.0, 1)
    assert stats.compute("s") == 2.0
    seeded, clock = recorder(window=30.0)
    seeded.seed("s", 3.0)
    steady(seeded, clock, "s", 2.0, 5)
    assert seeded.compute("s") == 3.0  # the stored figure, unchanged until this owner's own figure is mature


def test_a_handoff_backlog_read_in_one_burst_is_no_spike() -> None:
    # The shard receives 1 KiB/s. The new owner starts 5 s after the old one stopped and reads the 5 s backlog in
    # one delivery: by arrival time the shard still received 1 KiB/s, and that is what is reported.
    stats, clock = recorder(window=30.0)
    stats.track("s")
    stats.record("s", 5 * KIB, clock.time() - 5.0, clock.time())
    steady(stats, clock, "s", 1.0, 20)
    assert stats.compute("s") == pytest.approx(1.0, abs=1e-6)
    # Counted by delivery time (KCL), the same reads make 25 KiB in 20 s: 1.25 KiB/s, 25 % too much.


def test_spark_batches_commit_seconds_of_records_at_once_without_bursts() -> None:
    # A batch every 5 s commits everything that arrived since the last one (only its last arrival is known).
    stats, clock = recorder(window=30.0)
    stats.track("s")
    figures = []
    for _ in range(12):
        clock.advance(5.0)
        stats.record("s", 10 * KIB, last_arrival=clock.time() - 0.5)
        figures.append(stats.compute("s"))
    mature = [figure for figure in figures if figure is not None]
    assert len(mature) >= 8
    assert all(figure == pytest.approx(2.0, rel=0.1) for figure in mature)


def test_a_stalled_reader_keeps_its_rate_and_an_idle_shard_decays() -> None:
    stats, clock = recorder(window=30.0)
    stats.track("s")
    steady(stats, clock, "s", 4.0, 30)
    assert stats.compute("s") == 4.0
    clock.advance(20.0)  # nothing read for 20 s (a stalled Spark batch): the window ends at the last arrival
    assert stats.compute("s") == 4.0
    clock.advance(25.0)  # 45 s without any read: more than a window behind, the last 15 s count as quiet
    assert stats.compute("s") == pytest.approx(0.5 * 2.0 + 0.5 * 4.0)
    idle, clock = recorder(window=30.0)
    idle.track("s")
    steady(idle, clock, "s", 4.0, 30)
    assert idle.compute("s") == 4.0
    clock.advance(15.0)
    idle.record("s", 0, last_arrival=clock.time())  # an empty read with no lag: quiet up to now
    assert idle.compute("s") == pytest.approx(0.5 * 2.0 + 0.5 * 4.0)


def test_ema_blends_the_new_window_with_the_previous_value() -> None:
    stats, clock = recorder(window=30.0)
    stats.track("s")
    steady(stats, clock, "s", 2.0, 30)
    assert stats.compute("s") == 2.0
    steady(stats, clock, "s", 6.0, 15)
    # The last 30 s hold 15 s at 2 and 15 s at 6 KiB/s: 4 KiB/s raw; EMA 0.5 x 4 + 0.5 x 2 = 3.
    assert stats.compute("s") == 3.0


def test_idle_lease_decays_to_exactly_zero() -> None:
    stats, clock = recorder()
    stats.track("s")
    steady(stats, clock, "s", 85.0, 60)
    values = [stats.compute("s")]
    for _ in range(40):
        clock.advance(60.0)
        values.append(stats.compute("s"))
    assert values[0] == 85.0
    assert values[-1] == 0.0
    positive = [value for value in values if value]
    assert all(value is not None and value >= 1e-6 for value in positive)  # no denormal tail


def test_seed_carries_the_previous_owners_value_on() -> None:
    stats, clock = recorder(window=4.0)
    stats.seed("s", 100.0)
    steady(stats, clock, "s", 50.0, 4)
    assert stats.compute("s") == 75.0  # 0.5 x 50 + 0.5 x 100: the stored value is the EMA's first value


def test_drop_forgets_the_lease() -> None:
    stats, _ = recorder()
    stats.record("a", MIB)
    stats.record("b", MIB)
    stats.drop("a")
    stats.drop("never-held")
    assert stats.compute("a") is None
    assert stats.lease_keys() == frozenset({"b"})


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_seed_is_a_typed_error(bad: float) -> None:
    stats, _ = recorder()
    with pytest.raises(InvalidMetricInput):
        stats.seed("s", bad)


def test_bad_input_is_a_typed_error() -> None:
    stats, _ = recorder()
    with pytest.raises(InvalidMetricInput):
        stats.record("s", -1)
    with pytest.raises(InvalidMetricInput):
        ThroughputRecorder(ManualClock(), window_seconds=0.0)
    with pytest.raises(InvalidMetricInput):
        ThroughputRecorder(ManualClock(), window_seconds=1.0, alpha=1.5)


def test_concurrent_recording_loses_nothing() -> None:
    stats, clock = recorder(window=2.0)
    for key in ("s0", "s1"):
        stats.track(key)
    clock.advance(2.0)
    barrier = threading.Barrier(8)

    def deliver(lease_key: str) -> None:
        barrier.wait()
        for _ in range(2000):
            stats.record(lease_key, 1024, clock.time() - 2.0, clock.time())

    threads = [threading.Thread(target=deliver, args=(f"s{i % 2}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # 4 threads x 2000 x 1 KiB per lease arriving over the 2 s window -> 4000 KiB/s.
    assert stats.compute("s0") == 4000.0
    assert stats.compute("s1") == 4000.0
