"""What a new agent's heartbeat says about its CPU before and after its first metrics report."""

from __future__ import annotations

from shardherd.agent.metrics.sampler import MetricsSampler
from shardherd.agent.runtime import MetricsReporter
from shardherd.coordinator.deciders.worker_metrics import classify
from shardherd.coordinator.moves import WorkerStatus
from shardherd.coordinator.snapshot import WorkerView
from shardherd.shared.clock import ManualClock
from shardherd.shared.worker import CPU_METRIC
from tests.agent.test_metrics_sampler import ScriptedCpu


def test_a_new_worker_is_left_out_until_its_first_report_then_balanced_by_cpu() -> None:
    clock = ManualClock()
    sampler = MetricsSampler(ScriptedCpu([40.0, 60.0]), history_size=10)
    reporter = MetricsReporter(sampler, clock, period=30.0)
    sts, opr = reporter()
    assert sts == {} and opr == {CPU_METRIC: (100.0,)}
    # The leader neither balances it by throughput (a metric-less worker) nor gives it leases yet.
    assert classify(WorkerView("new", sts, opr)) is WorkerStatus.INVALID_METRICS
    sampler.sample()
    sampler.sample()
    clock.advance(2.0)  # the first report comes after two capture periods
    sts, opr = reporter()
    assert sts == {CPU_METRIC: (50.0,)} and opr == {CPU_METRIC: (100.0,)}
    assert classify(WorkerView("new", sts, opr)) is WorkerStatus.ACTIVE
    clock.advance(10.0)
    assert reporter()[0] == {CPU_METRIC: (50.0,)}  # the same report until the next period closes


def test_without_a_cpu_source_the_worker_is_balanced_by_throughput() -> None:
    reporter = MetricsReporter(MetricsSampler(None, history_size=10), ManualClock(), period=30.0)
    sts, opr = reporter()
    assert sts == {} and opr == {}
    assert WorkerView("plain", sts, opr).uses_default_metric
