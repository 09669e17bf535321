import pytest

from shardherd.coordinator.decide import decide
from shardherd.coordinator.decider_config import DeciderConfig, Strategy
from shardherd.coordinator.deciders.lease_count import quotas
from shardherd.coordinator.moves import MoveReason, UnplacedReason
from shardherd.coordinator.snapshot import LeaseView, Snapshot
from tests.coordinator.test_decide import applied, counts, default, owned

LEASE_COUNT = DeciderConfig(strategy=Strategy.LEASE_COUNT)


@pytest.mark.parametrize(
    ("loads", "n", "cap", "expected"),
    [
        # 7 leases / 3 workers: base 2, one extra; "b" already holds 3 and keeps it.
        ({"a": 2, "b": 3, "c": 2}, 7, 99, {"a": 2, "b": 3, "c": 2}),
        # 6 / 3: base 2, no extra: the worker at 4 must drop to 2.
        ({"a": 4, "b": 1, "c": 1}, 6, 99, {"a": 2, "b": 2, "c": 2}),
        # 5 / 2: base 2, one extra; nobody at 3; over = [a(5)], under = [b(0)]: (1*1 + 1) // 2 = 1 to a.
        ({"a": 5, "b": 0}, 5, 99, {"a": 3, "b": 2}),
        # 4 / 2 but capped at 1 per worker.
        ({"a": 0, "b": 0}, 4, 1, {"a": 1, "b": 1}),
        # more workers than leases: base 0, 2 extras, a and b already hold 1.
        ({"a": 1, "b": 1, "c": 0}, 2, 99, {"a": 1, "b": 1, "c": 0}),
        ({}, 3, 99, {}),
    ],
)
def test_quotas(loads: dict[str, int], n: int, cap: int, expected: dict[str, int]) -> None:
    assert quotas(loads, n, cap) == expected


def _scaled_out() -> Snapshot:
    # 500 shards on 100 workers (5 each), then 100 more workers join.
    leases = [owned(f"shard-{i:03d}", f"old-{i % 100:03d}") for i in range(500)]
    workers = [default(f"old-{i:03d}") for i in range(100)] + [default(f"new-{i:03d}") for i in range(100)]
    return Snapshot.of(leases, workers)


def test_scale_out_resolves_kcl2_stable_imbalance() -> None:
    # base 500 // 200 = 2, 100 may hold 3; nobody holds 3 yet, so the 100 extras are split 50/50 between the 100
    # over-full old workers and the 100 empty new ones: old 50*3 + 50*2 = 250, new 250 (KCL 2.x: 300/200).
    snapshot = _scaled_out()
    plan = decide(snapshot, LEASE_COUNT, balance=True)
    after = counts(plan)
    assert set(after.values()) == {2, 3}
    assert sum(v for w, v in after.items() if w.startswith("old")) == 250
    assert sum(v for w, v in after.items() if w.startswith("new")) == 250
    assert len(plan.moves) == 250  # 50 old workers shed 2, 50 shed 3
    assert {m.reason for m in plan.moves} == {MoveReason.LEASE_COUNT}
    # A second run on the result is a fixed point.
    assert decide(applied(snapshot, plan), LEASE_COUNT, balance=True).moves == ()


def test_priority_goes_to_least_loaded_and_ignores_expired_count() -> None:
    leases = [owned("a1", "a"), owned("a2", "a"), owned("b1", "b", expired=True, silent_ms=1), LeaseView("u")]
    plan = decide(Snapshot.of(leases, [default("a"), default("b")]), LEASE_COUNT, balance=False)
    # b's only lease is expired, so b counts 0: u (unassigned first) goes to b. b1 expired under b (alive, yet not
    # renewing it), so it goes to the other worker rather than back to the owner it expired under.
    assert [(m.lease_key, m.to_worker, m.reason) for m in plan.moves] == [
        ("u", "b", MoveReason.UNASSIGNED),
        ("b1", "a", MoveReason.EXPIRED),
    ]


def test_drain_and_cap_spill() -> None:
    leases = [owned(f"d{i}", "d") for i in range(3)] + [LeaseView("u")]
    workers = [default("d", draining=True), default("a")]
    plan = decide(
        Snapshot.of(leases, workers), DeciderConfig(strategy=Strategy.LEASE_COUNT, max_leases_for_worker=2), False
    )
    assert [(m.lease_key, m.reason) for m in plan.moves] == [("u", MoveReason.UNASSIGNED), ("d0", MoveReason.DRAIN)]
    assert [(u.lease_key, u.reason) for u in plan.held] == [
        ("d1", UnplacedReason.NO_CAPACITY),
        ("d2", UnplacedReason.NO_CAPACITY),
    ]


def test_pinned_lease_is_not_shed() -> None:
    leases = [owned(f"a{i}", "a", checkpoint_owner="a", handoff_blocked=True) for i in range(4)]
    plan = decide(Snapshot.of(leases, [default("a"), default("b")]), LEASE_COUNT, balance=True)
    assert plan.moves == ()
