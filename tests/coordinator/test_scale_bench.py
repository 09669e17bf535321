"""The live scale bench's reading of the leader's published moves (bench/scale.py)."""

from __future__ import annotations

from bench.scale import moves_between


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
