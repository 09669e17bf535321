"""The after-run checks on hand-made ledgers: each one must catch the fault it exists for."""

from __future__ import annotations

from collections.abc import Sequence

from shardherd.shared.checkpoint import Checkpoint
from tests.chaos.analysis import (
    FENCING,
    Lifetime,
    Report,
    RunData,
    Timing,
    analyse,
    check_children_after_parents,
    check_duplicates,
    check_no_loss,
    check_overlap,
    check_unowned,
    owner_changes,
    stints_of_others,
    tenures,
)
from tests.chaos.cluster import Event, LeaseRow, Sample
from tests.chaos.ledgers import CheckpointMark, Delivery, Produced

TIMING = Timing(failover=3.0, interval=0.3, sample_period=0.25)
S0 = "shardId-000000000000"


def _run(deliveries: Sequence[Delivery], marks: Sequence[CheckpointMark] = (), events: Sequence[Event] = (),
         samples: Sequence[Sample] = (), lifetimes: dict[str, Lifetime] | None = None,
         parents: dict[str, tuple[str, ...]] | None = None) -> RunData:
    produced = [Produced(d.data, d.shard, d.sequence, d.time) for d in deliveries]
    lives = lifetimes or {w: Lifetime(0.0, None, "close") for w in {d.worker for d in deliveries}}
    return RunData(list(deliveries), list(marks), produced, list(samples), list(events), lives, parents or {}, TIMING)


def _d(seq: int, worker: str, at: float, shard: str = S0) -> Delivery:
    return Delivery(shard, seq, 0, worker, at, f"{shard[-1]}-{seq}")


def test_tenures_split_at_gaps() -> None:
    assert tenures([1.0, 2.0, 3.0, 9.0, 10.0], 2.5) == [(1.0, 3.0), (9.0, 10.0)]


def test_loss_is_reported() -> None:
    data = _run([_d(1, "a", 1.0)])
    data.produced.append(Produced("x-9", S0, 9, 1.0))
    check = check_no_loss(data)
    assert not check.ok and "x-9" in check.detail


def test_redelivery_before_a_covering_checkpoint_is_allowed_after_it_is_not() -> None:
    # a delivered 1 and 2, checkpointed 1, died; b redelivers 2 (allowed) and then 1 (covered: a violation).
    data = _run([_d(1, "a", 1.0), _d(2, "a", 2.0), _d(2, "b", 6.0), _d(1, "b", 6.5)],
                marks=[CheckpointMark(S0, 1, 0, "a", 1.1)])
    checks = check_duplicates(data, Report())
    assert not checks[0].ok and "'b'" in checks[0].detail and "0-1" in checks[0].detail
    allowed = _run([_d(1, "a", 1.0), _d(2, "a", 2.0), _d(2, "b", 6.0)], marks=[CheckpointMark(S0, 1, 0, "a", 1.1)])
    assert all(c.ok for c in check_duplicates(allowed, Report()))


def test_duplicate_after_a_graceful_stop_is_flagged() -> None:
    lives = {"a": Lifetime(0.0, 5.0, "term"), "b": Lifetime(0.0, None, "close")}
    data = _run([_d(1, "a", 4.5), _d(1, "b", 6.0)], lifetimes=lives)
    report = Report()
    checks = check_duplicates(data, report)
    assert not checks[1].ok and report.counts["graceful duplicates"] == 1


def test_overlap_is_measured_and_graceful_overlap_fails() -> None:
    interleaved = [_d(i, "a", float(i)) for i in range(1, 8)] + [_d(i, "b", i + 0.5) for i in range(3, 6)]
    lives = {"a": Lifetime(0.0, 8.0, "term"), "b": Lifetime(0.0, None, "close")}
    report = Report()
    checks = check_overlap(_run(interleaved, lifetimes=lives), report)
    assert report.figures["overlap s"] == [2.0]
    assert checks[0].ok and not checks[1].ok


def test_child_read_before_its_parent_ended_is_flagged() -> None:
    child = "shardId-000000000009"
    data = _run([_d(1, "a", 1.0), _d(2, "a", 5.0), _d(1, "b", 3.0, child)], parents={child: (S0,)})
    assert not check_children_after_parents(data).ok
    data = _run([_d(1, "a", 1.0), _d(1, "b", 3.0, child)], parents={child: (S0,)})
    assert check_children_after_parents(data).ok


def test_unowned_lease_with_a_leader_and_a_live_agent_is_bounded() -> None:
    row = LeaseRow(None, None, Checkpoint.at(5), frozenset())
    samples = [Sample(10.0 + 0.25 * i, {S0: row}, "coord-1") for i in range(40)]
    lives = {"agent-1": Lifetime(0.0, None, "close")}
    report = Report()
    assert not check_unowned(_run([], samples=samples, lifetimes=lives), report).ok
    assert report.figures["longest unowned s"][0] > TIMING.unowned_bound
    partitioned = [Event(9.0, "partition", "agent-1")]  # no live agent: not the leader's fault
    assert check_unowned(_run([], samples=samples, lifetimes=lives, events=partitioned), Report()).ok


def test_partitioned_agent_delivering_past_the_deadline_fails_fencing() -> None:
    events = [Event(10.0, "partition", "a"), Event(20.0, "partition_end", "a")]
    late = analyse(_run([_d(1, "a", 9.0), _d(2, "a", 14.5), _d(3, "b", 15.0)], events=events))
    assert [c.ok for c in late.checks if c.name == FENCING] == [False]
    timely = analyse(_run([_d(1, "a", 9.0), _d(2, "a", 12.0), _d(3, "b", 15.0)], events=events))
    assert [c.ok for c in timely.checks if c.name == FENCING] == [True]


def test_a_quick_handoff_back_and_forth_is_not_an_overlap_but_interleaving_is() -> None:
    def rows(pattern: str) -> list[Delivery]:
        return [Delivery("s-0", index, 0, f"agent-{who}", float(index) * 0.1, f"r{index}")
                for index, who in enumerate(pattern)]

    handoffs = rows("AAAABBBBAAAA")  # A hands to B and B back to A within the split gap
    spans = tenures([d.time for d in handoffs if d.worker == "agent-A"], 2.5, stints_of_others(handoffs, "agent-A"))
    assert [(round(a, 1), round(b, 1)) for a, b in spans] == [(0.0, 0.3), (0.8, 1.1)]
    together = rows("ABABABAB")  # both read the shard at once: one long tenure each, so they overlap
    spans = tenures([d.time for d in together if d.worker == "agent-A"], 2.5, stints_of_others(together, "agent-A"))
    assert [(round(a, 1), round(b, 1)) for a, b in spans] == [(0.0, 0.6)]


def test_owner_changes_count_each_move_within_the_window_except_skipped_leases() -> None:
    def held(*owners: tuple[str | None, str | None]) -> dict[str, LeaseRow]:
        return {f"s{index}": LeaseRow(owner, giver, Checkpoint.at(5), frozenset())
                for index, (owner, giver) in enumerate(owners)}

    samples = [Sample(1.0, held(("a", None), ("b", None)), None),
               Sample(2.0, held(("b", "a"), ("b", None)), None),  # s0 handed off: its reader is still a
               Sample(3.0, held(("b", None), ("a", None)), None),  # s0 now read by b, s1 moved to a
               Sample(4.0, held(("a", None), ("a", None)), None)]
    assert owner_changes(samples, 0.0, 10.0) == 3
    assert owner_changes(samples, 0.0, 3.0) == 2
    assert owner_changes(samples, 0.0, 10.0, skip=["s1"]) == 2
    assert owner_changes(samples, 3.5, 10.0) == 0  # one sample: nothing to compare
