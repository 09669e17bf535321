"""What a new agent's heartbeat says about its CPU before and after its first metrics report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardherd.agent.metrics.sampler import MetricsSampler
from shardherd.agent.runtime import Agent, MetricsReporter
from shardherd.coordinator.snapshot import WorkerView
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.worker import CPU_METRIC
from shardherd.shared.worker_metrics import WorkerStatus, classify
from tests.agent.test_metrics_sampler import ScriptedCpu
from tests.support.waiting import wait_for


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


class _NoRecords:
    """A processor factory the cadence test never calls: the agent holds no lease."""

    def __call__(self) -> Any:
        raise AssertionError("no lease is processed in this test")


@pytest.mark.parametrize(("mode", "entries"), [("worker", 4), ("lease", 1)])
def test_worker_mode_agents_close_a_cpu_interval_with_every_heartbeat(tmp_path: Path, mode: str,
                                                                      entries: int) -> None:
    # The heartbeat rewrites the row anyway: in worker mode each one carries a fresh CPU figure, so the leader sees
    # a move in its owners' CPU within seconds. Lease mode keeps KCL's 30 s spacing for Java KCL leaders.
    clock = ManualClock()
    settings = load_settings(application_name="cadence", stream_name="s", worker_id="a1", liveness_mode=mode,
                             cgroup_root=str(tmp_path), kinesis_endpoint_url="http://127.0.0.1:9")
    store = MemoryLeaseStore(settings.table_names)
    agent = Agent(settings, _NoRecords(), clock=clock, store=store)
    assert agent.sampler.source is not None
    for _ in range(4):
        clock.advance(settings.effective_heartbeat_interval_millis / 1000)
        agent.sampler.sample()
        agent.keeper.tick()
    (row,) = store.scan_workers().workers
    assert len(row.metric_stats[CPU_METRIC]) == entries


def test_a_started_agents_first_row_already_carries_its_first_cpu_report(tmp_path: Path) -> None:
    """The first heartbeat waits for the first report (2 s after the start), so the leader can count and fill a new
    worker from its first row instead of its second (decision 0038). Real threads and clock: about 3 s."""
    settings = load_settings(application_name="first-row", stream_name="s", worker_id="a1",
                             cgroup_root=str(tmp_path), kinesis_endpoint_url="http://127.0.0.1:9")
    store = MemoryLeaseStore(settings.table_names)
    agent = Agent(settings, _NoRecords(), store=store)
    assert agent.sampler.source is not None
    agent.start()
    try:
        wait_for(lambda: bool(store.scan_workers().workers), 10, "the first heartbeat")
        (row,) = store.scan_workers().workers
        assert row.heartbeat == 1 and classify(row) is WorkerStatus.ACTIVE, row.metric_stats
    finally:
        agent.stop(drain=False)
