"""The live scale bench's reading of the leader's published moves (bench/scale.py)."""

from __future__ import annotations

from bench.scale import CpuReports, lane_write_seconds, moves_between, new_reports, owned_elsewhere, replay_offsets
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.store import TableNames
from shardherd.shared.worker import CPU_METRIC, WorkerRecord


def _move(lease: str, started: float, reason: str, kind: str = "move") -> dict[str, object]:
    return {"lease_key": lease, "epoch": 1, "run_started_at": started, "kind": kind, "reason": reason,
            "detail": "-", "from_owner": "a", "to_worker": "b"}


def test_balancing_moves_are_timed_by_their_runs_start_on_the_monotonic_clock() -> None:
    wall = 1_000_000.0  # the wall clock minus the monotonic one
    published = [_move("s3", wall + 150.0, "BALANCE_CPU"), _move("s1", wall + 102.0, "BALANCE_THROUGHPUT"),
                 _move("s2", wall + 101.0, "UNASSIGNED"), _move("s4", wall + 120.0, "BALANCE_THROUGHPUT", "unplaced"),
                 _move("s5", wall + 99.0, "BALANCE_THROUGHPUT"), _move("s6", wall + 130.0, "SOME_NEWER_REASON")]
    found = moves_between(published, wall, 100.0, 140.0)
    # placing (UNASSIGNED), an unplaced lease and runs outside the window are left out; a reason this bench does not
    # know counts as balancing (the totals count it so too)
    assert [(at, move["lease_key"]) for at, move in found] == [(102.0, "s1"), (130.0, "s6")]


def test_the_first_assignments_owners_replay_before_it_and_the_others_after() -> None:
    # The 16-shard smoke run: rows of agent-2 and agent-3 seen at the look that first saw an owned lease (0.0); the
    # first assignment gave leases to agent-1 and agent-3, agent-2 was filled 1.5 s later.
    seen = {"agent-1": -0.54, "agent-2": 0.0, "agent-3": 0.0, "agent-4": -4.4, "spark": 28.4}
    assert replay_offsets(seen, {"agent-1", "agent-3"}) == [
        (-0.54, "agent-1"), (-0.5, "agent-3"), (0.0, "agent-2"), (0.0, "agent-4"), (28.4, "spark")]


def test_the_leaders_time_per_write_and_lane_comes_from_the_run_that_wrote_most() -> None:
    # Session 28's run 2: the first assignment wrote 256 owners in 1,131 ms on 8 lanes (32 writes each); a balancing
    # run's 5 handoffs are one write per lane, its time mostly the run's own rounding.
    runs = [(0.0, 0), (1131.0, 256), (41.0, 5)]
    assert abs(lane_write_seconds(runs, 8) - 1.131 / 32) < 1e-12
    assert abs(lane_write_seconds([(700.0, 250)], 8) - 0.7 / 32) < 1e-12  # 250 writes: 32 rounds, the last short
    assert lane_write_seconds([(0.0, 0)], 8) == 0.0 and lane_write_seconds([], 8) == 0.0


def test_new_cpu_reports_are_what_a_rows_history_holds_beyond_the_last_look() -> None:
    assert new_reports([], [1.0, 2.0]) == [1.0, 2.0]
    assert new_reports([1.0, 2.0], [1.0, 2.0, 3.0]) == [3.0]  # a history not yet full grows
    assert new_reports([1.0, 2.0, 3.0], [2.0, 3.0, 4.0]) == [4.0]  # a full one drops its oldest
    assert new_reports([1.0, 2.0, 3.0], [3.0, 4.0, 5.0]) == [4.0, 5.0]  # two reports between looks
    assert new_reports([1.0, 2.0, 3.0], [7.0, 8.0, 9.0]) == [7.0, 8.0, 9.0]  # more than the history holds
    assert new_reports([1.0, 2.0], [1.0, 2.0]) == []


def test_cpu_reports_are_recorded_per_agent_from_the_second_look_at_its_row() -> None:
    store = MemoryLeaseStore(TableNames.for_application("scale-cpu"))

    def report(worker: str, history: list[float]) -> None:
        store.upsert_worker(WorkerRecord(worker, 1, metric_stats={CPU_METRIC: tuple(history)}))

    cpu = CpuReports(store)
    report("agent-1", [0.8, 0.9])
    cpu.look()  # the reports made before the window are not the window's
    report("agent-1", [0.8, 0.9, 1.4])
    report("agent-2", [15.0])  # a row first seen now: learnt, not counted
    cpu.look()
    report("agent-1", [0.9, 1.4, 1.1, 0.7])
    report("agent-2", [15.0, 16.2])
    cpu.look()
    assert cpu.reports == {"agent-1": [1.4, 1.1, 0.7], "agent-2": [16.2]}


def test_the_kills_owned_time_is_the_first_look_after_it_with_every_lease_held_by_another_worker() -> None:
    killed = 100.0  # the scenario's first line, the instant after the kill
    looks: list[tuple[float, dict[str, str | None]]] = [
        (99.2, {"s1": "victim", "s2": "victim", "s3": "b"}),  # the look that chose the victim
        (100.4, {"s1": "victim", "s2": "victim", "s3": "b"}),
        (100.9, {"s1": "a", "s2": None, "s3": "b"}),  # s2 not owned yet
        (101.6, {"s1": "a", "s3": "b"}),  # s2 missing from this view: not seen owned
        (102.0, {"s1": "a", "s2": "victim", "s3": "b"}),  # the holder during a handoff from the victim
        (102.8, {"s1": "a", "s2": "c", "s3": "b"}),
        (103.1, {"s1": "a", "s2": "c", "s3": "b"})]
    seconds, look = owned_elsewhere(looks, ["s1", "s2"], "victim", killed)
    assert seconds is not None and abs(seconds - 2.8) < 1e-9
    assert look is not None and abs(look - 0.8) < 1e-9  # it happened between 102.0 and 102.8
    assert owned_elsewhere(looks[:6], ["s1", "s2"], "victim", 103.0) == (None, None)  # no look after the kill saw it
    assert owned_elsewhere(looks[:5], ["s1", "s2"], "victim", killed) == (None, None)
