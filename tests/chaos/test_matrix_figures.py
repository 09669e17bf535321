"""The fault matrix's figures on hand-made run data: each must see the stall it exists for, and no stall otherwise."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from shardherd.shared.checkpoint import Checkpoint, Sentinel
from tests.chaos.analysis import Lifetime, RunData, Timing
from tests.chaos.cluster import LeaseRow, Sample
from tests.chaos.ledgers import Delivery, Produced
from tests.chaos.matrix import dead_threads, held_unread, new_leader, read_again, undo_jump

S0, S1 = "shardId-000000000000", "shardId-000000000001"
OPEN = LeaseRow("a", None, Checkpoint.of(Sentinel.TRIM_HORIZON), frozenset())


def _data(deliveries: list[Delivery], holders: dict[float, dict[str, str]],
          leaders: dict[float, str | None] | None = None) -> RunData:
    samples = [Sample(at, {shard: LeaseRow(owner, None, OPEN.checkpoint, frozenset())
                           for shard, owner in owners.items()}, (leaders or {}).get(at, "coord-1"))
               for at, owners in sorted(holders.items())]
    produced = [Produced(d.data, d.shard, d.sequence, d.time) for d in deliveries]
    return RunData(deliveries, [], produced, samples, [], {"a": Lifetime(0, None, "close")}, {},
                   Timing(3.0, 0.3, 0.25))


def _every(shard: str, worker: str, start: float, end: float, step: float = 0.5) -> list[Delivery]:
    count = int((end - start) / step)
    return [Delivery(shard, i, 0, worker, start + i * step, f"{shard}-{worker}-{i}") for i in range(count + 1)]


def test_flowing_shards_have_no_stall() -> None:
    data = _data(_every(S0, "a", 0, 20) + _every(S1, "b", 0, 20),
                 {float(t): {S0: "a", S1: "b"} for t in range(21)})
    assert read_again(data, 5.0, 20.0) == 0.0
    assert held_unread(data, 5.0, 20.0) <= 0.5


def test_a_killed_workers_shard_is_read_again_when_another_takes_it() -> None:
    deliveries = _every(S0, "a", 0, 5) + _every(S0, "b", 9.5, 20) + _every(S1, "b", 0, 20)
    holders = {float(t): {S0: "a" if t < 9 else "b", S1: "b"} for t in range(21)}
    data = _data(deliveries, holders)
    assert read_again(data, 5.0, 20.0) == 4.5
    assert held_unread(data, 5.0, 20.0) == 3.0  # "a" held S0 from its last delivery at 5.0 until 8.0


def test_a_shard_never_read_again_is_none() -> None:
    data = _data(_every(S0, "a", 0, 5) + _every(S1, "b", 0, 20), {float(t): {S0: "a", S1: "b"} for t in range(21)})
    assert read_again(data, 5.0, 20.0) is None
    assert held_unread(data, 5.0, 20.0) == 15.0


def test_dead_threads_are_read_from_logs(tmp_path: Path) -> None:
    (tmp_path / "coord-1.log").write_text("x\nException in thread leader-loop:\nTraceback\n", encoding="utf-8")
    (tmp_path / "agent-3.log").write_text("fine\n", encoding="utf-8")
    assert dead_threads(tmp_path) == ["leader-loop@coord-1"]


def test_a_clock_jump_is_undone_from_the_step_on() -> None:
    rows = [Delivery(S0, i, 0, "a", at, f"x{i}") for i, at in enumerate([10.0, 10.5, 311.0, 311.5])]
    rows.append(Delivery(S1, 9, 0, "b", 11.0, "y"))
    fixed = undo_jump(rows, "a", 300.0)
    assert [d.time for d in fixed] == [10.0, 10.5, 11.0, 11.5, 11.0]
    back = undo_jump([replace(d, time=d.time - 600.0 if d.time > 300 else d.time) for d in rows[:4]], "a", -300.0)
    assert [d.time for d in back] == [10.0, 10.5, 11.0, 11.5]


def test_the_lead_moving_is_a_figure_whether_or_not_the_fault_targeted_the_leader() -> None:
    holders = {float(t): {S0: "a"} for t in range(21)}
    steady = _data([], holders)
    assert new_leader(steady, 5.0, "agent-3") is None and new_leader(steady, 5.0, None) is None
    assert new_leader(steady, 5.0, "coord-1") is None  # the killed leader's lock never moved: no failover seen
    moved = _data([], holders, {float(t): None if t < 10 else "coord-2" for t in range(8, 21)})
    assert new_leader(moved, 5.0, "coord-1") == 5.0  # failover: the first sample of another holder, at 10
    assert new_leader(moved, 5.0, "agent-3") == 5.0  # the same move in a cell that hit an agent: not asked for
    assert new_leader(moved, 12.0, "agent-3") is None  # coord-2 already led at t0
