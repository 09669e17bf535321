"""Per-lease throughput: KiB/s over the renew window, EMA alpha 0.5, seeding, idle decay, drops, thread safety."""

from __future__ import annotations

import math
import threading

import pytest

from agent.metrics import InvalidMetricInput
from agent.metrics.throughput import ThroughputRecorder
from shared.clock import ManualClock

MIB = 1024 * 1024
GIB = 1024 * MIB


def recorder(window: float = 60.0) -> tuple[ThroughputRecorder, ManualClock]:
    clock = ManualClock()
    return ThroughputRecorder(clock, window_seconds=window), clock


def test_kcl_anchor_five_mib_in_a_minute() -> None:
    stats, _ = recorder()
    for _ in range(5):
        stats.record("shardId-000", MIB)
    # 5 x 1024 KiB / 60 s = 85.3333... KiB/s, first value as is, 6 decimals.
    assert stats.compute("shardId-000") == 85.333333
    assert stats.compute("shardId-000") == 85.333333  # reading again changes nothing


def test_kcl_anchor_a_thousand_gib() -> None:
    stats, _ = recorder()
    for _ in range(1000):
        stats.record("s", GIB)
    # 1000 x 1048576 KiB / 60 s = 17 476 266.666... KiB/s.
    assert stats.compute("s") == 17_476_266.666667


def test_unknown_lease_is_none_and_expired_stats_give_zero() -> None:
    stats, clock = recorder()
    assert stats.compute("never") is None
    stats.record("s", MIB)
    clock.advance(60.0)  # the delivery is now exactly one window old
    assert stats.compute("s") == 0.0


def test_ema_blends_the_new_window_with_the_previous_value() -> None:
    stats, clock = recorder()
    stats.record("s", 5 * MIB)
    assert stats.compute("s") == 85.333333
    clock.advance(30.0)
    stats.record("s", 10 * MIB)
    # Both deliveries are within the last 60 s: 15 MiB -> 256 KiB/s; EMA 0.5 x 256 + 0.5 x 85.333333 = 170.6666665.
    assert stats.compute("s") == 170.666667
    clock.advance(31.0)
    # Only the 10 MiB delivery is left: 170.666667 KiB/s raw; EMA 0.5 x 170.666667 + 0.5 x 170.666667.
    assert stats.compute("s") == 170.666667


def test_idle_lease_decays_to_exactly_zero() -> None:
    stats, clock = recorder()
    stats.record("s", 5 * MIB)
    values = [stats.compute("s")]
    for _ in range(40):
        clock.advance(60.0)
        values.append(stats.compute("s"))
    assert values[1] == pytest.approx(42.6666665, abs=1e-6)  # halved
    assert values[-1] == 0.0
    positive = [value for value in values if value]
    assert all(value is not None and value >= 1e-6 for value in positive)  # no denormal tail
    # 85.33 halves below 5e-7 (which rounds to 0) after log2(85.33 / 5e-7) = 27.3 halvings.
    assert 27 <= len(positive) <= 29


def test_seed_carries_the_previous_owners_value_on() -> None:
    stats, clock = recorder(window=4.0)
    stats.seed("s", 100.0)
    # The new owner reads at the same rate: 100 KiB per second for the 4 s window.
    for _ in range(4):
        stats.record("s", 100 * 1024)
        clock.advance(1.0)
    # Deliveries at t = 0, 1, 2, 3; at t = 4 the first is exactly one window old: 300 KiB / 4 s = 75 KiB/s raw.
    assert stats.compute("s") == 87.5  # 0.5 x 75 + 0.5 x 100: the stored value is the EMA's first value


def test_seed_without_new_data_halves_and_is_not_divided_by_the_window() -> None:
    stats, _ = recorder(window=3.308)
    stats.seed("s", 100.0)
    # KCL would start from 100 / 3.308 = 30.23; here the stored value is the previous EMA value: 0.5 x 0 + 0.5 x 100.
    assert stats.compute("s") == 50.0


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
    stats, _ = recorder(window=1.0)
    barrier = threading.Barrier(8)

    def deliver(lease_key: str) -> None:
        barrier.wait()
        for _ in range(2000):
            stats.record(lease_key, 1024)

    threads = [threading.Thread(target=deliver, args=(f"s{i % 2}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # 4 threads x 2000 x 1 KiB per lease in a 1 s window -> 8000 KiB/s.
    assert stats.compute("s0") == 8000.0
    assert stats.compute("s1") == 8000.0
