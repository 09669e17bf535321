"""The live scale bench's reading of the leader's published moves (bench/scale.py)."""

from __future__ import annotations

from bench.scale import moves_between, replay_offsets


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
