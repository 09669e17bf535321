"""The sampler's per-report history (KCL `sts`/`opr`), its bounds, failed intervals and the sampling thread."""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from shardherd.agent.metrics import InvalidMetricInput, MetricSourceError
from shardherd.agent.metrics.cpu_proc import ProcStatCpu
from shardherd.agent.metrics.sampler import MetricsSampler, SamplingThread
from shardherd.shared.clock import ManualClock, SystemClock
from shardherd.shared.worker import CPU_METRIC, WorkerRecord


class ScriptedCpu:
    """A CPU source that returns (or raises) the given values in order, then keeps returning the last one."""

    name = "scripted"

    def __init__(self, values: Iterable[float | Exception]) -> None:
        self._values = list(values)
        self.calls = 0

    def sample(self) -> float:
        value = self._values[min(self.calls, len(self._values) - 1)]
        self.calls += 1
        if isinstance(value, Exception):
            raise value
        return value


def sample_n(sampler: MetricsSampler, n: int) -> None:
    for _ in range(n):
        sampler.sample()


def test_report_averages_and_rounds_the_interval() -> None:
    sampler = MetricsSampler(ScriptedCpu([10.0, 20.0, 45.0, 0.1, 0.2, 0.2]), history_size=10)
    sample_n(sampler, 3)
    first = sampler.report()
    sample_n(sampler, 3)
    second = sampler.report()
    assert first.metric_stats == {CPU_METRIC: (25.0,)}  # (10 + 20 + 45) / 3
    assert second.metric_stats == {CPU_METRIC: (25.0, 0.166667)}  # 0.5 / 3 = 0.1666..., 6 decimals, oldest first
    assert second.operating_range == {CPU_METRIC: (100.0,)}


def test_interval_without_valid_samples_reports_minus_one() -> None:
    failure = MetricSourceError("cgroup file vanished")
    sampler = MetricsSampler(ScriptedCpu([50.0, failure, failure, 30.0]), history_size=10)
    sampler.sample()
    assert sampler.report().metric_stats[CPU_METRIC] == (50.0,)
    assert sampler.report().metric_stats[CPU_METRIC] == (50.0, -1.0)  # no sample taken at all
    sample_n(sampler, 2)  # both fail
    assert sampler.report().metric_stats[CPU_METRIC] == (50.0, -1.0, -1.0)
    sample_n(sampler, 1)
    assert sampler.report().metric_stats[CPU_METRIC] == (50.0, -1.0, -1.0, 30.0)
    assert sampler.counters().failed == 2


def test_out_of_range_samples_are_rejected_and_counted() -> None:
    sampler = MetricsSampler(ScriptedCpu([100.5, -0.1, math.nan, 100.0, 0.0]), history_size=10)
    results = [sampler.sample() for _ in range(5)]
    assert results == [None, None, None, 100.0, 0.0]
    assert sampler.counters().rejected == 3
    assert sampler.report().metric_stats[CPU_METRIC] == (50.0,)


def test_a_source_bug_counts_as_a_failed_sample() -> None:
    sampler = MetricsSampler(ScriptedCpu([ZeroDivisionError("bug"), 40.0]), history_size=3)
    assert sampler.sample() is None
    assert sampler.sample() == 40.0
    assert sampler.counters().failed == 1


def test_history_and_raw_queue_are_bounded() -> None:
    values = [float(i % 7) for i in range(300)] + [99.0, 1.0, 2.0, 3.0]
    sampler = MetricsSampler(ScriptedCpu(values), history_size=3)
    sample_n(sampler, 301)
    assert sampler.counters().overflowed == 1  # the 301st sample (99) found the queue of 300 full
    # The 300 kept are 0..6 repeating: 42 full cycles (sum 21 each) plus 0..5 (sum 15) = 897 / 300 = 2.99.
    assert sampler.report().metric_stats[CPU_METRIC] == (2.99,)
    for _ in range(3):
        sampler.sample()
        sampler.report()
    # Only the last 3 intervals are kept, oldest first: 2, 3 and the empty one.
    assert sampler.report().metric_stats[CPU_METRIC] == (2.0, 3.0, -1.0)


def test_disabled_metrics_report_empty_maps_so_the_leader_uses_throughput() -> None:
    report = MetricsSampler(None, history_size=10).report()
    record = WorkerRecord("w1", 1_700_000_000, report.metric_stats, report.operating_range)
    assert record.uses_default_metric


def test_report_feeds_a_worker_record(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")
    sampler = MetricsSampler(ProcStatCpu(proc_stat_path=stat), history_size=10)
    sampler.sample()  # first call: 0
    stat.write_text("cpu  160 0 120 820 0 0 0 0 0 0\n")  # busy +80 of total +100 -> 80 %
    sampler.sample()
    report = sampler.report()
    record = WorkerRecord("w1", 1_700_000_000, report.metric_stats, report.operating_range)
    assert not record.uses_default_metric
    assert record.metric_stats == {CPU_METRIC: (40.0,)}  # (0 + 80) / 2


def test_bad_sizes_are_typed_errors() -> None:
    with pytest.raises(InvalidMetricInput):
        MetricsSampler(None, history_size=0)
    with pytest.raises(InvalidMetricInput):
        SamplingThread(MetricsSampler(None, history_size=1), ManualClock(), 0.0, random.Random(1))


def test_start_jitter_is_seeded_and_spread_over_the_period() -> None:
    sampler = MetricsSampler(None, history_size=1)
    delays = [SamplingThread(sampler, ManualClock(), 2.0, random.Random(seed)).start_delay for seed in range(200)]
    again = [SamplingThread(sampler, ManualClock(), 2.0, random.Random(seed)).start_delay for seed in range(200)]
    assert delays == again
    assert all(0.0 <= delay < 2.0 for delay in delays)
    assert min(delays) < 0.1 and max(delays) > 1.9  # spread over the whole period, not bunched
    assert len(set(delays)) == 200


def test_sampling_thread_samples_on_the_period_and_stops_at_once() -> None:
    source = ScriptedCpu([12.0])
    sampler = MetricsSampler(source, history_size=5)
    fast = SamplingThread(sampler, SystemClock(), 0.02, random.Random(3))
    fast.start()
    deadline = time.monotonic() + 5.0
    while source.calls < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    fast.stop(timeout=2.0)
    assert source.calls >= 5
    calls_after_stop = source.calls
    time.sleep(0.05)
    assert source.calls == calls_after_stop
    assert sampler.report().metric_stats[CPU_METRIC] == (12.0,)

    slow = SamplingThread(MetricsSampler(ScriptedCpu([1.0]), history_size=1), SystemClock(), 60.0, random.Random(3))
    slow.start()
    started = time.monotonic()
    slow.stop(timeout=5.0)
    assert time.monotonic() - started < 1.0  # the wait of up to 60 s is interrupted
    assert not any(thread.name == "shardherd-cpu-sampler" and thread.is_alive() for thread in threading.enumerate())
