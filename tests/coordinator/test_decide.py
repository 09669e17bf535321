"""Builders shared by the decider tests (imported by test_variance and test_lease_count), config and snapshot
validation, and property-based invariants of both strategies."""

import dataclasses
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardherd.coordinator.decide import DECIDERS, decide
from shardherd.coordinator.decider_config import DeciderConfig, Strategy
from shardherd.coordinator.moves import Plan
from shardherd.coordinator.snapshot import InvalidSnapshot, LeaseView, Snapshot, WorkerView
from shardherd.shared.checkpoint import SHARD_END
from shardherd.shared.config import load_settings
from shardherd.shared.errors import ConfigError
from shardherd.shared.lease import Lease
from shardherd.shared.worker import WorkerRecord, WorkerState


def cpu(worker_id: str, value: float, limit: float = 100.0, draining: bool = False) -> WorkerView:
    """A worker whose CPU history is flat at `value` (so its EMA is exactly `value`)."""
    return WorkerView(worker_id, {"C": (value, value)}, {"C": (limit,)}, draining=draining)


def default(worker_id: str, draining: bool = False) -> WorkerView:
    """A worker that reports no metric (balanced by its throughput share)."""
    return WorkerView(worker_id, draining=draining)


def owned(key: str, owner: str | None, kbps: float | None = None, **flags: object) -> LeaseView:
    """A lease with an owner and throughput."""
    return LeaseView(key, owner, throughput_kbps=kbps, **flags)  # type: ignore[arg-type]


def applied(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """The snapshot the next run would see if every move of `plan` was written (and renewed)."""
    to = {move.lease_key: move.to_worker for move in plan.moves}
    leases = [
        dataclasses.replace(
            lease, lease_owner=to[lease.key], checkpoint_owner=None, expired=False, handoff_blocked=False
        )
        if lease.key in to
        else lease
        for lease in snapshot.leases
    ]
    return Snapshot.of(leases, snapshot.workers)


def counts(plan: Plan) -> dict[str, int]:
    """Leases per worker after the plan."""
    return {w.worker_id: w.leases_after for w in plan.workers}


# -- configuration and snapshot validation ------------------------------------------------------------------------


def test_every_strategy_name_has_one_decider_module() -> None:
    assert set(DECIDERS) == set(Strategy)
    assert all(decider.name == strategy.value for strategy, decider in DECIDERS.items())


@pytest.mark.parametrize(("assignment", "balancing", "strategy"), [
    ("variance", "band", Strategy.BAND),
    ("variance", "kcl", Strategy.KCL_VARIANCE),
    ("lease-count", "band", Strategy.LEASE_COUNT),
    ("lease-count", "kcl", Strategy.LEASE_COUNT),
])
def test_settings_choose_the_strategy_by_name(assignment: str, balancing: str, strategy: Strategy) -> None:
    settings = load_settings(lease_assignment_strategy=assignment, variance_balancing=balancing)
    assert DeciderConfig.from_settings(settings).strategy is strategy


def test_a_strategy_pair_no_module_implements_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="lease_assignment_strategy='random'"):
        Strategy.from_settings("random", "band")


def test_config_from_settings() -> None:
    config = DeciderConfig.from_settings(
        load_settings(lease_assignment_strategy="lease-count", dampening_percentage=80, max_leases_for_worker=7)
    )
    assert config.strategy is Strategy.LEASE_COUNT
    assert (config.dampening_percentage, config.max_leases_for_worker) == (80, 7)
    assert config.rebalance_dead_band_percentage == 2.0 and config.worker_metrics_ema_alpha == 0.5


@pytest.mark.parametrize(
    "bad",
    [
        {"dampening_percentage": 0},
        {"rebalance_threshold_percentage": 101},
        {"max_leases_for_worker": 0},
        {"max_throughput_per_host_kbps": 0.0},
        {"worker_metrics_ema_alpha": 0.0},
        {"rebalance_dead_band_percentage": -1.0},
    ],
)
def test_config_rejects_bad_values(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        DeciderConfig(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Snapshot.of([LeaseView("a"), LeaseView("a")], []), "appears twice"),
        (lambda: Snapshot.of([], [WorkerView("w"), WorkerView("w")]), "appears twice"),
        (lambda: LeaseView("a", throughput_kbps=-1.0), "finite number"),
        (lambda: LeaseView("a", throughput_kbps=math.nan), "finite number"),
        (lambda: LeaseView("a", handoff_blocked=True), "checkpoint_owner"),
        (lambda: LeaseView(""), "empty key"),
        (lambda: WorkerView(""), "empty id"),
    ],
)
def test_snapshot_rejects_bad_input(build: object, message: str) -> None:
    with pytest.raises(InvalidSnapshot, match=message):
        build()  # type: ignore[operator]


def test_views_from_shared_model() -> None:
    lease = Lease("s-1", lease_owner="b", checkpoint_owner="a", checkpoint=SHARD_END, throughput_kbps=3.0)
    view = LeaseView.from_lease(lease, expired=True, silent_ms=40, handoff_blocked=True)
    assert (view.actual_owner, view.finished, view.needs_owner, view.pinned) == ("a", True, True, False)
    record = WorkerRecord("w", 0, {"C": (1.0,)}, {"C": (80.0,)}, state=WorkerState.DRAINING)
    worker = WorkerView.from_record(record)
    assert worker.draining and not worker.uses_default_metric


@pytest.mark.parametrize("strategy", list(Strategy))
def test_dispatch(strategy: Strategy) -> None:
    plan = decide(Snapshot.of([LeaseView("a")], [default("w")]), DeciderConfig(strategy=strategy), balance=True)
    assert plan.strategy == strategy.value
    assert plan.moves_by_reason() == {plan.moves[0].reason: 1}


# -- invariants of both strategies --------------------------------------------------------------------------------


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    workers: list[WorkerView] = []
    for i in range(draw(st.integers(0, 6))):
        draining = draw(st.integers(0, 4)) == 0
        kind = draw(st.sampled_from(["default", "cpu", "failing"]))
        if kind == "default":
            workers.append(default(f"w{i}", draining))
        else:
            history = draw(st.lists(st.floats(0, 100), min_size=1, max_size=4))
            if kind == "failing":
                history.append(-1.0)
            limit = draw(st.sampled_from([50.0, 80.0, 100.0]))
            workers.append(WorkerView(f"w{i}", {"C": tuple(history)}, {"C": (limit,)}, draining))
    owners: list[str | None] = [w.worker_id for w in workers]
    owners += ["ghost", None]
    leases = []
    for i in range(draw(st.integers(0, 30))):
        owner = draw(st.sampled_from(owners))
        kbps = draw(st.one_of(st.none(), st.floats(0, 1000)))
        expired = owner is not None and draw(st.booleans())
        pinned = owner is not None and not expired and draw(st.integers(0, 5)) == 0
        leases.append(
            LeaseView(
                f"l{i}",
                owner,
                checkpoint_owner=owner if pinned else None,
                throughput_kbps=kbps,
                expired=expired,
                silent_ms=draw(st.integers(0, 100_000)),
                handoff_blocked=pinned,
            )
        )
    return Snapshot.of(leases, workers)


configs = st.builds(
    DeciderConfig,
    strategy=st.sampled_from(list(Strategy)),
    max_leases_for_worker=st.sampled_from([1, 3, 2**31 - 1]),
    dampening_percentage=st.sampled_from([60.0, 80.0, 100.0]),
    rebalance_dead_band_percentage=st.sampled_from([0.0, 2.0]),
)


def _receivers(snapshot: Snapshot, config: DeciderConfig) -> set[str]:
    if config.strategy is Strategy.LEASE_COUNT:
        return {w.worker_id for w in snapshot.workers if not w.draining}
    return {w.worker_id for w in snapshot.workers if not w.draining and (w.metric_stats.get("C", (0.0,))[-1] != -1)}


@settings(max_examples=300, deadline=None)
@given(snapshot=snapshots(), config=configs, balance=st.booleans())
def test_plan_invariants(snapshot: Snapshot, config: DeciderConfig, balance: bool) -> None:
    plan = decide(snapshot, config, balance)
    moved = [m.lease_key for m in plan.moves]
    assert len(moved) == len(set(moved)), "a lease moved twice"
    leases = {lease.key: lease for lease in snapshot.leases}
    assert not any(leases[key].pinned for key in moved), "a pinned lease moved"
    assert {m.to_worker for m in plan.moves} <= _receivers(snapshot, config)
    # Receivers end within max_leases (expired leases that found no new owner still count for the old one).
    after = counts(plan)
    for u in plan.spillover:
        if u.owner in after:
            after[u.owner] -= 1
    assert all(after[m.to_worker] <= config.max_leases_for_worker for m in plan.moves)
    # Nothing silently dropped: every lease that needs an owner is moved or reported as spillover.
    spilled = {u.lease_key for u in plan.spillover}
    needy = {key for key, lease in leases.items() if lease.needs_owner}
    assert needy <= set(moved) | spilled
    # ... and spillover only happens when no receiver has room left.
    if spilled:
        assert all(after[w] >= config.max_leases_for_worker for w in _receivers(snapshot, config))
    # Draining workers keep only leases that are reported as held (or expired ones, which are priority leases).
    draining = {w.worker_id for w in snapshot.workers if w.draining}
    held = {u.lease_key for u in plan.held}
    for key, lease in leases.items():
        if lease.actual_owner in draining and not lease.needs_owner:
            assert key in set(moved) | held
    # Same input, any order: same plan.
    shuffled = list(snapshot.leases)
    random.Random(7).shuffle(shuffled)
    assert decide(Snapshot.of(shuffled, reversed(snapshot.workers)), config, balance) == plan


@settings(max_examples=100, deadline=None)
@given(
    n_workers=st.integers(1, 8),
    n_leases=st.integers(0, 40),
    value=st.floats(1, 90),
    kbps=st.floats(0, 500),
    strategy=st.sampled_from(list(Strategy)),
)
def test_balanced_fleet_gets_no_moves(
    n_workers: int, n_leases: int, value: float, kbps: float, strategy: Strategy
) -> None:
    # Equal CPU everywhere (variance), and counts within one of each other (lease-count).
    workers = [cpu(f"w{i}", value) for i in range(n_workers)]
    leases = [owned(f"l{i}", f"w{i % n_workers}", kbps) for i in range(n_leases)]
    plan = decide(Snapshot.of(leases, workers), DeciderConfig(strategy=strategy), balance=True)
    assert plan.moves == ()


@settings(max_examples=150, deadline=None)
@given(
    owners=st.lists(st.integers(0, 7), max_size=60),
    n_workers=st.integers(1, 8),
    unassigned=st.integers(0, 10),
)
def test_lease_count_converges_in_one_run(owners: list[int], n_workers: int, unassigned: int) -> None:
    leases = [owned(f"l{i}", f"w{o % n_workers}") for i, o in enumerate(owners)]
    leases += [LeaseView(f"u{i}") for i in range(unassigned)]
    snapshot = Snapshot.of(leases, [default(f"w{i}") for i in range(n_workers)])
    config = DeciderConfig(strategy=Strategy.LEASE_COUNT)
    plan = decide(snapshot, config, balance=True)
    after = counts(plan)
    assert max(after.values()) - min(after.values()) <= 1
    assert decide(applied(snapshot, plan), config, balance=True).moves == ()


@settings(max_examples=100, deadline=None)
@given(n_workers=st.integers(1, 6), n_leases=st.integers(0, 40))
def test_every_unassigned_lease_assigned_when_capacity_exists(n_workers: int, n_leases: int) -> None:
    workers = [cpu(f"w{i}", 10.0 * i) for i in range(n_workers)]
    leases = [LeaseView(f"l{i}", throughput_kbps=float(i)) for i in range(n_leases)]
    config = DeciderConfig(max_leases_for_worker=max(1, -(-n_leases // n_workers)))
    plan = decide(Snapshot.of(leases, workers), config, balance=False)
    assert len(plan.moves) == n_leases and plan.spillover == ()
