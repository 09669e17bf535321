"""The leader lock on every backend, driven on a virtual clock: acquire, heartbeat, takeover, release, fencing."""

from __future__ import annotations

from shardherd.coordinator.leader_lock import DURATION, EPOCH, OWNER, RELEASED, TERM, VERSION, LeaderLock
from shardherd.shared.checkpoint import TRIM_HORIZON
from shardherd.shared.clock import ManualClock
from shardherd.shared.lease import new_lease
from shardherd.shared.store import Conflict, LeaseStore

DURATION_MS = 6_000
PERIOD_MS = 1_500


def _lock(store: LeaseStore, owner: str, clock: ManualClock) -> LeaderLock:
    return LeaderLock(store, owner, clock, DURATION_MS, PERIOD_MS)


def _run(clock: ManualClock, seconds: float, *locks: LeaderLock, step: float = 0.5) -> None:
    """Advance virtual time in small steps, ticking every given lock (a dead process is simply not passed)."""
    elapsed = 0.0
    while elapsed < seconds:
        clock.advance(step)
        elapsed += step
        for lock in locks:
            lock.tick()


def test_first_contender_acquires_with_a_java_compatible_item(store: LeaseStore) -> None:
    clock = ManualClock()
    lock = _lock(store, "coord-a", clock)
    assert lock.tick() is True
    item = store.get_state("Leader")
    assert item is not None
    assert item[OWNER] == "coord-a"
    assert item[DURATION] == "6000"  # milliseconds as a string, as the Java lock client writes it
    version = item[VERSION]
    assert isinstance(version, str) and len(version) == 36
    assert item[EPOCH] == 1 and isinstance(item[TERM], str)
    assert lock.epoch() == 1


def test_live_holder_is_never_taken_over(store: LeaseStore) -> None:
    clock = ManualClock()
    holder, contender = _lock(store, "coord-a", clock), _lock(store, "coord-b", clock)
    assert holder.tick()
    _run(clock, 30, holder, contender)
    assert holder.is_leader() and not contender.is_leader()
    assert store.get_state("Leader")[OWNER] == "coord-a"  # type: ignore[index]


def test_dead_holder_is_taken_over_after_the_lease_duration_and_fenced(store: LeaseStore) -> None:
    clock = ManualClock()
    holder, contender = _lock(store, "coord-a", clock), _lock(store, "coord-b", clock)
    assert holder.tick()
    old_fence = holder.fence()
    assert old_fence is not None
    store.create_lease(new_lease("shardId-000000000000", TRIM_HORIZON))
    assert store.assign("shardId-000000000000", "w1", None, None, fence=old_fence).applied
    _run(clock, 3, holder, contender)
    # kill -9 of the holder: it stops ticking. The contender must wait a full lease duration of unchanged version.
    killed_at = clock.monotonic()
    taken_at = None
    while taken_at is None and clock.monotonic() - killed_at < 20:
        _run(clock, 0.5, contender)
        if contender.is_leader():
            taken_at = clock.monotonic()
    assert taken_at is not None
    waited = taken_at - killed_at
    assert DURATION_MS / 1000 < waited <= (DURATION_MS + 2 * PERIOD_MS) / 1000 + 0.5
    assert contender.epoch() == 2
    assert not holder.is_leader()  # its own lease ran out locally before the takeover
    assert holder.fence() is None
    # A write the old leader had in flight with its old fence cannot land any more.
    late = store.assign("shardId-000000000000", "w2", "w1", None, fence=old_fence)
    assert not late.applied and late.conflict is Conflict.FENCED
    assert store.get_lease("shardId-000000000000").lease_owner == "w1"  # type: ignore[union-attr]
    new_fence = contender.fence()
    assert new_fence is not None
    assert store.assign("shardId-000000000000", "w2", "w1", None, fence=new_fence).applied


def test_holder_that_cannot_heartbeat_steps_down_before_anyone_can_take_over(store: LeaseStore) -> None:
    clock = ManualClock()
    holder = _lock(store, "coord-a", clock)
    assert holder.tick()
    # Partitioned: no tick reaches the store. Leadership must end locally strictly before the duration passes.
    clock.advance(DURATION_MS / 1000 - 0.2)
    assert not holder.is_leader()
    assert holder.fence() is None


def test_release_lets_a_successor_in_at_once(store: LeaseStore) -> None:
    clock = ManualClock()
    holder, contender = _lock(store, "coord-a", clock), _lock(store, "coord-b", clock)
    assert holder.tick()
    contender.tick()
    assert holder.release() is True
    assert store.get_state("Leader") is None  # the Java client deletes the item on release
    clock.advance(PERIOD_MS / 1000)
    assert contender.tick() is True
    assert contender.epoch() == 2  # the item was deleted, but the epoch counter item was not: no epoch repeats


def test_epochs_strictly_increase_across_releases_and_restarts(store: LeaseStore) -> None:
    clock = ManualClock()
    epochs = []
    for round_ in range(4):
        # A fresh LeaderLock each round: a coordinator process restarted with nothing in memory.
        lock = _lock(store, f"coord-{round_ % 2}", clock)
        assert lock.tick() is True
        epoch = lock.epoch()
        assert epoch is not None
        epochs.append(epoch)
        item = store.get_state("Leader")
        assert item is not None and item[EPOCH] == epoch
        assert lock.release() is True
        assert store.get_state("Leader") is None  # still deleted on release, as the Java lock client does
        clock.advance(PERIOD_MS / 1000)
    assert epochs == [1, 2, 3, 4]


def test_epoch_continues_above_a_lock_item_written_before_the_counter_existed(store: LeaseStore) -> None:
    clock = ManualClock()
    # A lock item left by an older shardherd (epoch 7 in the item, no counter item), now released.
    assert store.put_state("Leader", {OWNER: "old", DURATION: "6000", VERSION: "v-old", RELEASED: "1", EPOCH: 7})
    lock = _lock(store, "coord-a", clock)
    assert lock.tick() is True
    assert lock.epoch() == 8
    lock.release()
    # A KCL worker takes the lock in between and deletes it on release: its item carries no epoch at all.
    assert store.put_state("Leader", {OWNER: "kcl-worker", DURATION: "120000", VERSION: "v-kcl"})
    assert store.delete_state("Leader", {OWNER: "kcl-worker"})
    clock.advance(PERIOD_MS / 1000)
    again = _lock(store, "coord-b", clock)
    assert again.tick() is True
    assert again.epoch() == 9


def test_java_lock_client_items_are_respected_and_taken_over(store: LeaseStore) -> None:
    clock = ManualClock()
    # An item exactly as the Java lock client 1.4.0 writes it for KCL 3.x (no shardherd attributes).
    store.put_state("Leader", {OWNER: "kcl-java-worker", DURATION: "120000",
                               VERSION: "c0ffee00-0000-4000-8000-000000000001"})
    lock = _lock(store, "coord-a", clock)
    _run(clock, 60, lock)
    assert not lock.is_leader()  # the Java holder's own 120 s duration applies, not ours
    _run(clock, 65, lock)
    assert lock.is_leader()
    item = store.get_state("Leader")
    assert item is not None and item[OWNER] == "coord-a"


def test_released_java_item_is_taken_immediately(store: LeaseStore) -> None:
    clock = ManualClock()
    store.put_state("Leader", {OWNER: "kcl-java-worker", DURATION: "120000", RELEASED: "1",
                               VERSION: "c0ffee00-0000-4000-8000-000000000002"})
    lock = _lock(store, "coord-a", clock)
    assert lock.tick() is True
    assert RELEASED not in store.get_state("Leader")  # type: ignore[operator]


def test_lock_taken_by_someone_else_is_noticed_at_the_next_heartbeat(store: LeaseStore) -> None:
    clock = ManualClock()
    holder = _lock(store, "coord-a", clock)
    assert holder.tick()
    store.put_state("Leader", {OWNER: "intruder", DURATION: "6000", VERSION: "v-intruder"})
    _run(clock, PERIOD_MS / 1000 + 0.5, holder)
    assert not holder.is_leader()
