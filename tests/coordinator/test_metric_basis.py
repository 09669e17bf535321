"""A fleet mixing metric kinds is balanced on the kinds every balanced worker reports (pure rule)."""

from __future__ import annotations

from shardherd.coordinator.decide import decide
from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.metric_basis import on_common_basis
from shardherd.coordinator.snapshot import LeaseView, Snapshot, WorkerView
from shardherd.shared.worker import CPU_METRIC, MEMORY_METRIC, common_metric_kinds

CPU = {CPU_METRIC: (40.0, 40.0)}
CPU_RANGE = {CPU_METRIC: (100.0,)}


def _leases(owner: str, count: int = 8, kbps: float = 100.0) -> list[LeaseView]:
    return [LeaseView(f"shard-{index}", lease_owner=owner, throughput_kbps=kbps) for index in range(count)]


def test_common_kinds_are_the_intersection_and_a_metric_less_worker_leaves_none() -> None:
    assert common_metric_kinds([{"C": (1.0,), "M": (2.0,)}, {"C": (3.0,)}]) == {"C"}
    assert common_metric_kinds([{"C": (1.0,)}, {}]) == frozenset()
    assert common_metric_kinds([]) == frozenset()


def test_a_cpu_agent_and_a_throughput_only_kcl_worker_are_both_balanced_by_throughput_share() -> None:
    snapshot = Snapshot.of(_leases("agent"), [WorkerView("agent", CPU, CPU_RANGE), WorkerView("kcl")])
    based = on_common_basis(snapshot)
    assert all(worker.uses_default_metric for worker in based.workers)
    plan = decide(snapshot, DeciderConfig(), balance=True)
    assert plan.moves and {move.to_worker for move in plan.moves} == {"kcl"}


def test_extra_kinds_are_dropped_and_invalid_or_draining_workers_neither_set_the_basis_nor_change() -> None:
    both = WorkerView("both", {**CPU, MEMORY_METRIC: (70.0,)}, {**CPU_RANGE, MEMORY_METRIC: (100.0,)})
    cpu = WorkerView("cpu", CPU, CPU_RANGE)
    starting = WorkerView("starting", {}, CPU_RANGE)  # no history yet: invalid, left out of balancing
    leaving = WorkerView("leaving", draining=True)
    based = {w.worker_id: w for w in on_common_basis(Snapshot.of([], [both, cpu, starting, leaving])).workers}
    assert dict(based["both"].metric_stats) == CPU and dict(based["both"].operating_range) == CPU_RANGE
    assert based["cpu"] == cpu and based["starting"] == starting and based["leaving"] == leaving


def test_a_fleet_sharing_its_kinds_is_unchanged() -> None:
    snapshot = Snapshot.of(_leases("a"), [WorkerView("a", CPU, CPU_RANGE), WorkerView("b", CPU, CPU_RANGE)])
    assert on_common_basis(snapshot) is snapshot
