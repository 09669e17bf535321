"""A full leader run's time split into its parts (RunLaps), with the run thread's CPU time beside its wall time, and
both published in the leader's status: on real stores, the leader on a virtual clock (the parts are real time)."""

from __future__ import annotations

import time

from shardherd.coordinator.run_summary import FULL_RUN_PARTS, RunLaps, RunSummary
from shardherd.services.leader_status import LeaderWatch, read_status
from shardherd.shared.store import LeaseStore
from tests.coordinator.test_leader_loop import INTERVAL, Fleet, _even_shards

PARTS = set(FULL_RUN_PARTS) - {"scan", "decide"}


def test_laps_add_up_to_the_span_and_cpu_follows_work() -> None:
    began = time.perf_counter()
    laps = RunLaps()
    time.sleep(0.02)  # waiting: wall time, no CPU
    laps.lap("wait")
    spin_until = time.thread_time() + 0.03
    while time.thread_time() < spin_until:  # working: CPU (and wall time, more on a busy host)
        pass
    laps.lap("work")
    time.sleep(0.01)
    laps.lap("wait")
    span = (time.perf_counter() - began) * 1000
    parts = laps.parts()
    assert set(parts) == {"wait", "work"}
    assert parts["wait"] >= 30 and parts["work"] >= 30
    assert sum(parts.values()) <= span
    assert 30 <= laps.cpu_ms() < parts["wait"] + parts["work"]  # the sleeps cost no CPU


def _timed_runs(fleet: Fleet, runs: int) -> list[tuple[RunSummary, float]]:
    """Leader runs an interval apart, the workers heartbeating: each summary with its wall milliseconds."""
    timed = []
    for _ in range(runs):
        fleet.heartbeat()
        fleet.lock.tick()
        began = time.perf_counter()
        summary = fleet.loop.run_once()
        assert summary is not None
        timed.append((summary, (time.perf_counter() - began) * 1000))
        fleet.clock.advance(INTERVAL)
    return timed


def test_a_full_run_reports_every_part_and_its_cpu(loop_store: LeaseStore) -> None:
    fleet = Fleet(loop_store, _even_shards(12))
    fleet.join("w1", "w2", "w3")
    timed = _timed_runs(fleet, 4)
    assert sum(summary.writes.assigned for summary, _ in timed) == 12
    for summary, wall in timed:
        assert summary.scanned
        assert set(summary.parts) == PARTS
        assert all(ms >= 0 for ms in summary.parts.values())
        accounted = summary.scan_ms + summary.decide_ms + sum(summary.parts.values())
        assert 0 < accounted <= wall
        assert 0 < summary.cpu_ms <= wall + 1  # thread_time ticks coarser than perf_counter
    assigning = next(summary for summary, _ in timed if summary.writes.assigned)
    assert assigning.parts["write"] > 0
    creating = next(summary for summary, _ in timed if summary.writes.created)
    assert creating.parts["sync"] > 0


def test_the_status_publishes_the_parts_and_the_cpu(loop_store: LeaseStore) -> None:
    fleet = Fleet(loop_store, _even_shards(6))
    watch = LeaderWatch(loop_store, "coord-a", fleet.clock, min_interval=0)
    fleet.join("w1", "w2")
    for summary, _ in _timed_runs(fleet, 3):
        watch.on_run(summary)
        status = read_status(loop_store)
        assert status is not None
        published = status.runs[-1]
        assert published.cpu_ms == round(summary.cpu_ms, 1)
        assert published.parts == {part: round(ms, 1) for part, ms in summary.parts.items() if round(ms, 1) > 0}
        # Why it read the tables (coordinator/scan_policy.py): the term's first run, then what it waited for.
        assert summary.scan_reason and published.scan_reason == summary.scan_reason[:60]
    status = read_status(loop_store)
    assert status is not None and status.runs[0].scan_reason == "first run of the term"
