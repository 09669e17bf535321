"""Restart reservations (shared/restart.py, decision 0035): the window's syntax, the rule, the decider and the leader.

The leader tests run the real leader loop on a virtual clock against SQLite and DynamoDB (moto), as
test_leader_loop.py does: a reserved worker's leases are neither expired nor moved within the window (a new leader
included), and fail over as a dead worker's once it passes.
"""

from __future__ import annotations

import pytest

from shardherd.coordinator.decide import decide
from shardherd.coordinator.decider_config import DeciderConfig, Strategy
from shardherd.coordinator.leader_lock import LeaderLock
from shardherd.coordinator.leader_loop import LeaderLoop
from shardherd.coordinator.snapshot import InvalidSnapshot, LeaseView, Snapshot
from shardherd.shared.restart import BadRestartWindow, parse_window, reserved, stop_window, stored_window
from shardherd.shared.store import LeaseStore
from shardherd.shared.worker import WorkerRecord
from tests.coordinator.test_decide import cpu, owned
from tests.coordinator.test_leader_loop import INTERVAL, Fleet, _even_shards


@pytest.mark.parametrize(("text", "millis"), [("60s", 60_000), ("1500ms", 1_500), ("2m", 120_000), ("90", 90_000),
                                              (" 2.5s ", 2_500)])
def test_windows_parse(text: str, millis: int) -> None:
    assert parse_window(text) == millis


@pytest.mark.parametrize(("text", "says"), [("soon", "not a duration"), ("-5s", "not a duration"),
                                            ("10h", "not a duration"), ("0s", "between"), ("500ms", "between"),
                                            ("2h", "not a duration"), ("61m", "between"), ("", "not a duration")])
def test_bad_windows_are_one_clear_error(text: str, says: str) -> None:
    with pytest.raises(BadRestartWindow, match=says) as caught:
        parse_window(text)
    assert "\n" not in str(caught.value)


def test_a_reservation_holds_while_the_row_is_silent_less_than_the_window() -> None:
    row = WorkerRecord("w1", 1, restart_within_ms=30_000)
    assert reserved(row, None) and reserved(row, 0.0) and reserved(row, 29.9)
    assert not reserved(row, 30.0)
    assert not reserved(WorkerRecord("w1", 1), 0.0)  # no reservation
    assert not reserved(None, 0.0)  # no row at all
    assert not reserved(WorkerRecord("w1", 1, restart_within_ms=30_000, drain_requested=True), 0.0)  # drain wins


def test_a_stopping_worker_reserves_by_its_deployment_or_an_operator_and_drains_when_asked_to() -> None:
    plain, announced = WorkerRecord("w1", 1), WorkerRecord("w1", 1, restart_within_ms=90_000)
    drained = WorkerRecord("w1", 1, restart_within_ms=90_000, drain_requested=True)
    assert stop_window(plain, None) is None and stop_window(None, None) is None  # shutdown_mode drain
    assert stop_window(plain, 60_000) == 60_000 and stop_window(None, 60_000) == 60_000  # shutdown_mode restart
    assert stop_window(announced, None) == 90_000  # an operator's `drain --restart`
    assert stop_window(drained, 60_000) is None and stop_window(drained, None) is None  # a drain wins


def test_an_unusable_stored_window_is_dropped_with_a_repair() -> None:
    repairs: list[str] = []
    assert stored_window(-1, repairs) is None and stored_window(True, repairs) is None
    assert stored_window(5_000, repairs) == 5_000 and stored_window(None, repairs) is None
    assert len(repairs) == 2


def test_a_reserved_lease_is_owned_and_not_expired() -> None:
    with pytest.raises(InvalidSnapshot):
        LeaseView("a", lease_owner="w1", reserved=True, expired=True)
    with pytest.raises(InvalidSnapshot):
        LeaseView("a", reserved=True)


@pytest.mark.parametrize("strategy", list(Strategy))
def test_no_decider_moves_a_reserved_lease(strategy: Strategy) -> None:
    # w1 holds every lease (far above the others) and drains: unreserved, its leases would all move this run.
    leases = [owned(f"s{i}", "w1", 100.0, reserved=i < 4) for i in range(8)]
    workers = [cpu("w1", 90.0, draining=True), cpu("w2", 5.0), cpu("w3", 5.0)]
    plan = decide(Snapshot.of(leases, workers), DeciderConfig(strategy=strategy), True)
    moved = {move.lease_key for move in plan.moves}
    assert moved == {"s4", "s5", "s6", "s7"}


def _reserve_and_kill(fleet: Fleet, worker: str, window_ms: int) -> set[str]:
    assert fleet.store.set_restart(worker, window_ms)
    fleet.alive.discard(worker)  # the process stopped: no more heartbeats
    return {key for key, owner in fleet.owners().items() if owner == worker}


def test_reserved_leases_wait_the_window_then_fail_over(loop_store: LeaseStore) -> None:
    fleet = Fleet(loop_store, _even_shards(4))
    fleet.join("w1", "w2")
    fleet.run(3 * INTERVAL)
    victims = _reserve_and_kill(fleet, "w2", 30_000)
    assert len(victims) == 2
    failover = fleet.settings.failover_time_millis / 1000
    waited = 0.0
    while all(fleet.owners()[key] == "w2" for key in victims) and waited < 60:
        fleet.run(INTERVAL)
        waited += INTERVAL
    assert 30.0 <= waited <= 30.0 + 2 * INTERVAL, waited  # well past the failover time (10 s): the window
    assert failover < 30.0
    assert all(fleet.owners()[key] == "w1" for key in victims)


def test_the_same_worker_back_within_the_window_keeps_everything_across_a_leader_change(
        loop_store: LeaseStore) -> None:
    fleet = Fleet(loop_store, _even_shards(4))
    fleet.join("w1", "w2")
    fleet.run(3 * INTERVAL)
    before = fleet.owners()
    _reserve_and_kill(fleet, "w2", 30_000)
    fleet.run(12.0)  # past the failover time
    # The leader changes hands: the new one knows of the reservation only from the store.
    fleet.lock = LeaderLock(loop_store, "coord-b", fleet.clock, fleet.settings.leader_lock_lease_duration_millis,
                            fleet.settings.leader_lock_heartbeat_period_millis)
    fleet.loop = LeaderLoop(loop_store, fleet.lock, fleet.settings, fleet.clock,
                            shard_source=lambda: list(fleet.shards))
    fleet.run(12.0)  # the old lock expires, coord-b leads and watches
    assert fleet.owners() == before
    fleet.join("w2")  # back with the same id; its first row ends the reservation (the agent clears it)
    fleet.run(INTERVAL)
    assert loop_store.set_restart("w2", None)
    fleet.run(30.0)
    assert fleet.owners() == before  # no move at all
