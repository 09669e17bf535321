"""The agent's lease keeper on real stores and a virtual clock: discovery, handoff, loss, fencing, drain."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from shardherd.agent.lease_keeper import LeaseKeeper, LossReason
from shardherd.agent.progress import ProgressBoard
from shardherd.coordinator.assignment_feed import AssignmentFeed
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.assignment_channel import OWNS
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import SHARD_END, TRIM_HORIZON, Checkpoint
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import Settings, load_settings
from shardherd.shared.dynamo.store import DynamoLeaseStore
from shardherd.shared.lease import Lease, new_lease
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.store import Conflict, LeaseStore, TableNames
from shardherd.shared.worker import NO_PROGRESS, WorkerState
from tests.support.faulty_proxy import INTERNAL_ERROR, Fault, FaultyProxy
from tests.support.stores import unique_app, worker_record

KEY = "shardId-000000000000"


@dataclass
class Events:
    """A listener that records what the keeper told it."""

    acquired: list[str] = field(default_factory=list)
    handoffs: list[str] = field(default_factory=list)
    lost: list[tuple[str, LossReason]] = field(default_factory=list)
    awaited: list[frozenset[str]] = field(default_factory=list)

    def lease_acquired(self, lease: Lease) -> None:
        self.acquired.append(lease.lease_key)

    def leases_awaited(self, lease_keys: frozenset[str]) -> None:
        self.awaited.append(lease_keys)

    def handoff_requested(self, lease: Lease) -> None:
        self.handoffs.append(lease.lease_key)

    def lease_lost(self, lease_key: str, reason: LossReason) -> None:
        self.lost.append((lease_key, reason))


def _settings(worker: str, **overrides: object) -> Settings:
    return load_settings(worker_id=worker, application_name="keeper-test", **overrides)


def _keeper(store: LeaseStore, worker: str, clock: ManualClock, **overrides: object) -> tuple[LeaseKeeper, Events]:
    events = Events()
    return LeaseKeeper(store, _settings(worker, **overrides), clock, events), events


def _holding(store: LeaseStore, worker: str, clock: ManualClock,
             **overrides: object) -> tuple[LeaseKeeper, Events]:
    """A keeper that has discovered and holds KEY (created and assigned to `worker` by a stand-in leader)."""
    keeper, events = _keeper(store, worker, clock, **overrides)
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    store.assign(KEY, worker, None, None)
    _step(clock, 2.5, keeper)
    assert events.acquired == [KEY]
    return keeper, events


def _step(clock: ManualClock, seconds: float, *keepers: LeaseKeeper) -> None:
    for _ in range(int(seconds / 0.5)):
        clock.advance(0.5)
        for keeper in keepers:
            keeper.tick()


def test_discovers_assigned_leases_and_heartbeats(store: LeaseStore) -> None:
    clock = ManualClock()
    keeper, events = _keeper(store, "w1", clock)
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    keeper.tick()
    assert events.acquired == []
    store.assign(KEY, "w1", None, None)
    _step(clock, 2.5, keeper)
    assert events.acquired == [KEY]
    record = worker_record(store, "w1")
    assert record is not None and record.heartbeat >= 1 and record.state is WorkerState.ACTIVE
    before = record.heartbeat
    _step(clock, 7, keeper)
    after = worker_record(store, "w1")
    assert after is not None and after.heartbeat >= before + 2  # one beat per failover/3 - epsilon


def test_graceful_handoff_between_two_keepers(store: LeaseStore) -> None:
    clock = ManualClock()
    old, old_events = _keeper(store, "w1", clock)
    new, new_events = _keeper(store, "w2", clock)
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    store.assign(KEY, "w1", None, None)
    _step(clock, 2.5, old, new)
    assert store.start_handoff(KEY, "w2", "w1").applied
    _step(clock, 2.5, old, new)
    assert old_events.handoffs == [KEY]
    assert new_events.acquired == []  # still draining from w1: the next owner waits
    assert old.checkpoint(KEY, Checkpoint.at("500")).applied  # the draining owner may checkpoint
    old.finish_handoff(KEY)
    _step(clock, 2.5, old, new)
    assert old_events.lost == [(KEY, LossReason.HANDED_OFF)]
    assert new_events.acquired == [KEY]
    lease = store.get_lease(KEY)
    assert lease is not None and lease.lease_owner == "w2" and lease.checkpoint_owner is None
    assert lease.checkpoint == Checkpoint.at("500")


def test_a_final_checkpoint_that_hands_over_ends_the_lease_and_the_next_owner_knew_it_was_coming(
        store: LeaseStore) -> None:
    clock = ManualClock()
    old, old_events = _holding(store, "w1", clock)
    new, new_events = _keeper(store, "w2", clock)
    plain = old.checkpoint(KEY, Checkpoint.at("400"), hand_over=True)  # no handoff running: a plain checkpoint
    assert plain.applied and KEY in old.held() and old_events.lost == []
    assert store.start_handoff(KEY, "w2", "w1").applied
    _step(clock, 1.5, old, new)
    assert old_events.handoffs == [KEY]
    assert new_events.awaited == [frozenset({KEY})] and new_events.acquired == []  # told once what is on its way
    assert old.checkpoint(KEY, Checkpoint.at("500"), hand_over=True).applied  # checkpoint and release: one write
    assert old_events.lost == [(KEY, LossReason.HANDED_OFF)] and old.held() == {}
    _step(clock, 0.5, new)
    assert new_events.acquired == [KEY] and new_events.awaited == [frozenset({KEY}), frozenset()]
    lease = store.get_lease(KEY)
    assert lease is not None and (lease.lease_owner, lease.checkpoint_owner) == ("w2", None)
    assert lease.checkpoint == Checkpoint.at("500")


class ReadsTogether:
    """A real store whose lease reads, once armed, pass only when `parties` of them are in flight at the same time."""

    def __init__(self, store: LeaseStore, parties: int) -> None:
        self.store = store
        self.together = threading.Barrier(parties, timeout=5)
        self.armed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def get_lease(self, lease_key: str) -> Lease | None:
        if self.armed:
            self.together.wait()  # BrokenBarrierError (out of the tick) if the reads come one after another
        return self.store.get_lease(lease_key)


def test_leases_handed_over_together_are_read_at_once_and_taken_in_one_recheck(store: LeaseStore) -> None:
    clock = ManualClock()
    keys = [f"shardId-00000000000{n}" for n in range(4)]
    reads = ReadsTogether(store, len(keys))
    events = Events()
    new = LeaseKeeper(cast(LeaseStore, reads), _settings("w2"), clock, events)
    for key in keys:
        store.create_lease(new_lease(key, TRIM_HORIZON))
        assert store.assign(key, "w1", None, None).applied
        assert store.start_handoff(key, "w2", "w1").applied  # a drain of w1: all of them to w2 in one run
    reads.armed = True
    new.tick()  # discovery reads the four at once: all still finishing at w1
    assert events.awaited == [frozenset(keys)] and events.acquired == []
    for key in keys:
        assert store.complete_handoff(key, "w1").applied
    clock.advance(0.25)
    new.tick()  # one recheck reads the four at once and takes them all
    assert sorted(events.acquired) == keys and events.awaited[-1] == frozenset()


def test_a_lease_handed_over_is_taken_within_a_recheck_of_the_release_not_at_the_next_discovery(
        store: LeaseStore) -> None:
    clock = ManualClock()
    old, old_events = _holding(store, "w1", clock)
    new, new_events = _keeper(store, "w2", clock)
    assert store.start_handoff(KEY, "w2", "w1").applied
    _step(clock, 1.5, old)
    assert old_events.handoffs == [KEY]
    new.tick()  # discovery finds the lease still draining from w1; the next one is a second away
    assert new_events.acquired == []
    clock.advance(0.05)
    old.finish_handoff(KEY)
    for _ in range(5):  # 0.25 s: more than one recheck (0.2 s), far less than the discovery interval
        clock.advance(0.05)
        new.tick()
    assert new_events.acquired == [KEY]


def test_handoff_is_forced_after_its_timeout(store: LeaseStore) -> None:
    clock = ManualClock()
    old, old_events = _holding(store, "w1", clock, graceful_lease_handoff_timeout_millis=5000)
    store.start_handoff(KEY, "w2", "w1")
    _step(clock, 3, old)
    assert old_events.handoffs == [KEY] and old_events.lost == []
    _step(clock, 5, old)
    assert old_events.lost == [(KEY, LossReason.HANDED_OFF)]


def test_lease_taken_by_the_leader_stops_processing_and_refuses_checkpoints(store: LeaseStore) -> None:
    clock = ManualClock()
    keeper, events = _holding(store, "w1", clock)
    store.assign(KEY, "w2", "w1", None)  # judged expired and reassigned
    outcome = keeper.checkpoint(KEY, Checkpoint.at("7"))
    assert not outcome.applied and outcome.conflict is Conflict.OWNERSHIP
    assert events.lost == [(KEY, LossReason.TAKEN)]
    assert store.get_lease(KEY).checkpoint == TRIM_HORIZON  # type: ignore[union-attr]


def test_deleted_lease_is_dropped(store: LeaseStore) -> None:
    clock = ManualClock()
    keeper, events = _holding(store, "w1", clock)
    store.delete_lease(KEY)
    _step(clock, 2.5, keeper)
    assert events.lost == [(KEY, LossReason.DELETED)]


def test_drain_announces_itself_and_release_gives_leases_back(store: LeaseStore) -> None:
    clock = ManualClock()
    keeper, events = _holding(store, "w1", clock)
    keeper.begin_drain()
    keeper.tick()
    record = worker_record(store, "w1")
    assert record is not None and record.state is WorkerState.DRAINING
    assert keeper.release_all() == [KEY]
    assert events.lost == [(KEY, LossReason.RELEASED)]
    lease = store.get_lease(KEY)
    assert lease is not None and lease.lease_owner is None


def test_a_stop_without_a_drain_says_draining_before_the_first_lease_is_free(store: LeaseStore) -> None:
    """A Spark driver whose query failed gave its leases back with its row still ACTIVE: the leader, told at once,
    handed one straight back, the driver exited, and the lease waited 22 s for a full scan (fault matrix)."""
    clock = ManualClock()
    keeper, _ = _holding(store, "w1", clock)
    seen: list[tuple[str | None, WorkerState | None]] = []

    def told() -> None:
        lease, record = store.get_lease(KEY), worker_record(store, "w1")
        seen.append((lease.lease_owner if lease else None, record.state if record else None))

    keeper.attach_channel(lambda: True, told)
    assert keeper.release_all() == [KEY]
    assert seen == [("w1", WorkerState.DRAINING), (None, WorkerState.DRAINING)]  # the row first, then the lease


class FailsToForget(Events):
    """A processing side that cannot record a loss (a Spark driver whose channel directory's disk is full)."""

    def lease_lost(self, lease_key: str, reason: LossReason) -> None:
        super().lease_lost(lease_key, reason)
        raise OSError(28, "No space left on device")


def test_release_all_gives_every_lease_back_even_if_the_listener_fails(store: LeaseStore) -> None:
    """Fault matrix, Spark channel disk full: the first lease's `lease_lost` raised and the rest stayed held."""
    clock = ManualClock()
    events = FailsToForget()
    keeper = LeaseKeeper(store, _settings("w1"), clock, events)
    keys = [KEY, "shardId-000000000001"]
    for key in keys:
        store.create_lease(new_lease(key, TRIM_HORIZON))
        store.assign(key, "w1", None, None)
    _step(clock, 2.5, keeper)
    assert sorted(events.acquired) == keys
    with pytest.raises(OSError):
        keeper.release_all()
    assert sorted(key for key, _ in events.lost) == keys
    assert all(lease.lease_owner is None for lease in (store.get_lease(key) for key in keys) if lease is not None)


def test_lease_mode_renews_each_lease_and_follows_a_handoff(store: LeaseStore) -> None:
    clock = ManualClock()
    keeper, events = _holding(store, "w1", clock, liveness_mode="lease")
    counter = store.get_lease(KEY).lease_counter  # type: ignore[union-attr]
    _step(clock, 10, keeper)
    assert store.get_lease(KEY).lease_counter >= counter + 2  # type: ignore[union-attr]
    assert keeper.checkpoint(KEY, Checkpoint.at("42")).applied  # bumps the counter; renewals must follow it
    store.start_handoff(KEY, "w2", "w1")
    _step(clock, 4, keeper)
    assert events.handoffs == [KEY]
    assert events.lost == []  # renewing as checkpoint owner keeps it alive while draining
    renewed = store.get_lease(KEY)
    _step(clock, 4, keeper)
    assert store.get_lease(KEY).lease_counter > renewed.lease_counter  # type: ignore[union-attr]


def _direct_and_proxied(moto: MotoServer, proxy: FaultyProxy, prefix: str,
                        clock: ManualClock) -> tuple[DynamoLeaseStore, DynamoLeaseStore]:
    """One application's tables (created), reached directly and through `proxy` (2 attempts per call)."""
    tables = TableNames.for_application(unique_app(prefix))
    direct = DynamoLeaseStore(make_client("dynamodb", "us-east-1", moto.endpoint_url), tables)
    direct.ensure_tables()
    return direct, DynamoLeaseStore(make_client("dynamodb", "us-east-1", proxy.endpoint_url), tables,
                                    retry=RetryPolicy(max_attempts=2, clock=clock))


@pytest.mark.dynamodb
def test_agent_cut_off_from_the_store_fences_itself_before_failover(moto_server: MotoServer) -> None:
    clock = ManualClock()
    with FaultyProxy(moto_server.endpoint_url) as proxy:
        direct, proxied = _direct_and_proxied(moto_server, proxy, "fence", clock)
        keeper, events = _keeper(proxied, "w1", clock)
        direct.create_lease(new_lease(KEY, TRIM_HORIZON))
        direct.assign(KEY, "w1", None, None)
        _step(clock, 2.5, keeper)
        assert events.acquired == [KEY]
        last_ok = clock.monotonic()
        proxy.add([INTERNAL_ERROR] * 10_000)  # partition: every request fails
        fenced_at = None
        while fenced_at is None and clock.monotonic() - last_ok < 20:
            _step(clock, 0.5, keeper)
            if events.lost:
                fenced_at = clock.monotonic()
        assert events.lost == [(KEY, LossReason.SELF_FENCED)]
        assert fenced_at is not None and fenced_at - last_ok < 10.0  # before the 10 s failover could expire it


class Channel:
    """The coordinator channel as the keeper sees it: a switchable health flag and the leader's feed."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.up = True
        self.feed = AssignmentFeed()

    def healthy(self) -> bool:
        return self.up

    def tell(self, keeper: LeaseKeeper) -> None:
        """What the leader's next run sends the keeper's waiting request (epoch 1)."""
        self.feed.observe(1, self.store.scan_leases().leases)
        keeper.tell(self.feed.position(keeper.worker_id).leases)


def _channelled_pair(store: LeaseStore, clock: ManualClock) -> tuple[
        Channel, tuple[LeaseKeeper, Events], tuple[LeaseKeeper, Events]]:
    """Keepers w1 and w2 on the coordinator channel, KEY created unowned and both past their first discovery (the
    next store poll is 30 s away)."""
    channel = Channel(store)
    first, second = _keeper(store, "w1", clock), _keeper(store, "w2", clock)
    for keeper, _ in (first, second):
        keeper.attach_channel(channel.healthy)
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    _step(clock, 1, first[0], second[0])
    return channel, first, second


def test_with_the_coordinator_channel_up_the_index_is_polled_rarely_and_handoffs_are_still_fast(
        store: LeaseStore) -> None:
    clock = ManualClock()
    channel, (old, old_events), (new, new_events) = _channelled_pair(store, clock)
    store.assign(KEY, "w1", None, None)
    _step(clock, 10, old, new)
    assert old_events.acquired == []  # nobody polls the index every second any more
    channel.tell(old)
    _step(clock, 0.5, old, new)
    assert old_events.acquired == [KEY]

    assert store.start_handoff(KEY, "w2", "w1").applied
    channel.tell(old)
    channel.tell(new)
    _step(clock, 0.5, old, new)
    assert old_events.handoffs == [KEY] and new_events.acquired == []
    _step(clock, 5, old, new)  # the receiver looks every second while the lease waits for its previous owner
    old.finish_handoff(KEY)
    _step(clock, 1, old, new)
    assert new_events.acquired == [KEY]  # without any word from the coordinator


def test_when_the_channel_fails_the_keeper_polls_the_index_every_second_again(store: LeaseStore) -> None:
    clock = ManualClock()
    channel = Channel(store)
    keeper, events = _keeper(store, "w1", clock)
    keeper.attach_channel(channel.healthy)
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    _step(clock, 1, keeper)
    channel.up = False
    keeper.discover_soon()  # what the watch does when its request fails
    _step(clock, 0.5, keeper)
    store.assign(KEY, "w1", None, None)
    _step(clock, 1.5, keeper)
    assert events.acquired == [KEY]


def test_a_wrong_view_from_the_coordinator_never_gives_a_lease_away(store: LeaseStore) -> None:
    clock = ManualClock()
    keeper, events = _keeper(store, "w1", clock)
    keeper.attach_channel(lambda: True)
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    store.assign(KEY, "w2", None, None)
    keeper.tell({KEY: OWNS})  # stale or wrong: the store says w2
    _step(clock, 1, keeper)
    assert events.acquired == [] and keeper.held() == {}


def test_a_handoff_from_a_worker_that_never_took_the_lease_completes_at_once(store: LeaseStore) -> None:
    """The leader assigned the lease to w1 and, in its next run (w2 had joined), handed it to w2 before w1 had
    discovered it: w1 never held it, so no final checkpoint of its own was coming, and w2 waited for it for good
    (a live rolling-restart run: two shards owned and never read for minutes, the status saying lag 0)."""
    clock = ManualClock()
    channel, (donor, donor_events), (receiver, receiver_events) = _channelled_pair(store, clock)
    store.assign(KEY, "w1", None, None)
    assert store.start_handoff(KEY, "w2", "w1").applied  # w1 has not looked since
    channel.tell(donor)
    channel.tell(receiver)
    _step(clock, 1.5, donor, receiver)
    assert donor_events.acquired == [] and donor_events.handoffs == []
    assert receiver_events.acquired == [KEY]
    row = store.get_lease(KEY)
    assert row is not None and row.checkpoint_owner is None and row.lease_owner == "w2"


def test_a_receiver_takes_a_lease_whose_handoff_outlived_its_timeout_and_a_failover(store: LeaseStore) -> None:
    """Whatever keeps the previous owner from completing a handoff (it never held the lease and heard nothing, a
    bug, a hung thread), the receiver does not wait for good: past the handoff timeout and one failover time (the
    leader's own bound on a pending handoff) it completes it itself, from the last checkpoint."""
    clock = ManualClock()
    receiver, events = _keeper(store, "w2", clock, graceful_lease_handoff_timeout_millis=5000)
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    store.assign(KEY, "w1", None, None)
    assert store.start_handoff(KEY, "w2", "w1").applied  # w1 holds it and never completes it (no keeper here)
    _step(clock, 14.5, receiver)  # 5 s timeout + 10 s failover: not yet
    assert events.acquired == []
    _step(clock, 2, receiver)
    assert events.acquired == [KEY]
    row = store.get_lease(KEY)
    assert row is not None and row.checkpoint_owner is None and row.lease_owner == "w2"


def test_the_keeper_tells_the_leader_only_what_it_must_see_at_once(store: LeaseStore) -> None:
    """News (decision 0010): a new row, a drain once its row is written, leases given back, a shard's end."""
    clock = ManualClock()
    news: list[str] = []

    def told() -> None:
        record = worker_record(store, "w1")
        news.append("row" if record is None else record.state.value)

    beats: list[tuple[int, int] | None] = []
    keeper, _ = _keeper(store, "w1", clock)
    keeper.attach_channel(lambda: True, told, lambda: beats.append(keeper.last_beat()))
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    store.assign(KEY, "w1", None, None)
    keeper.tick()
    assert news == [WorkerState.ACTIVE.value]  # the first row: the leader starts watching the new worker now
    keeper.discover_soon()
    _step(clock, 10.0, keeper)  # heartbeats and discovery: nothing new for the leader
    assert keeper.checkpoint(KEY, Checkpoint.at(5)).applied and news == [WorkerState.ACTIVE.value]
    # Each later row is named to the leader at once (a beat, not news), the row as written.
    row = worker_record(store, "w1")
    assert row is not None and len(beats) >= 2 and beats[-1] == keeper.last_beat() == (row.heartbeat, row.last_update)
    assert len(set(beats)) == len(beats)  # one beat per row written
    keeper.begin_drain()
    assert len(news) == 1  # not before the row says DRAINING: the leader would read the old row
    keeper.tick()
    assert news[1:] == [WorkerState.DRAINING.value]
    assert keeper.checkpoint(KEY, SHARD_END).applied and len(news) == 3  # shard sync may create the children
    assert keeper.release_all() == [KEY] and len(news) == 4


@pytest.mark.parametrize("throttled", [0, 5])
def test_a_lease_given_back_is_refused_in_the_row_before_it_is_free(store: LeaseStore, throttled: int) -> None:
    """The leader, told of the release at once, must read the refusal with the free lease: else it may hand the
    lease straight back to this worker (a CI run saw that loop for 60 s under load). Also when the lease has figures
    of its own in the row (reads throttled lately: the fault matrix's "Kinesis throttled, agent" cell had its lease
    handed straight back, the refusal hidden behind them)."""
    clock = ManualClock()
    totals = {KEY: 0}
    board = ProgressBoard(clock, throttle_totals=lambda: dict(totals))
    keeper = LeaseKeeper(store, _settings("w1"), clock, Events(), progress=board.snapshot)
    seen: list[bool] = []

    def told() -> None:  # each news: is the lease free, and does the row say refused?
        lease, row = store.get_lease(KEY), worker_record(store, "w1")
        if lease is not None and lease.lease_owner is None:
            seen.append(row is not None and row.lease_progress.get(KEY, NO_PROGRESS).refused)

    keeper.attach_channel(lambda: True, told)
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    store.assign(KEY, "w1", None, None)
    _step(clock, 2.5, keeper)
    assert keeper.held() and not seen
    totals[KEY] = throttled
    board.refuse(KEY)
    keeper.give_back(KEY)
    assert seen == [True] and not keeper.held()


def test_a_lease_that_starts_stalling_is_news_even_when_the_row_already_lists_it(store: LeaseStore) -> None:
    """The leader's verdicts count stalled leases (decisions 0039, 0043): a row whose lease turns stalled is news,
    though the lease was listed already (throttled reads), so the leader scans now, not at its full-scan cadence."""
    clock = ManualClock()
    stalled: set[str] = set()
    totals = {KEY: 0}
    board = ProgressBoard(clock, throttle_totals=lambda: dict(totals), stalled=lambda: frozenset(stalled))
    keeper = LeaseKeeper(store, _settings("w1"), clock, Events(), progress=board.snapshot)
    news: list[int] = []
    keeper.attach_channel(lambda: True, lambda: news.append(1))
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    store.assign(KEY, "w1", None, None)
    _step(clock, 2.5, keeper)
    totals[KEY] = 3
    clock.advance(1.0)
    keeper.beat_soon()
    keeper.beat()
    before = len(news)
    row = worker_record(store, "w1")
    assert row is not None and KEY in row.lease_progress  # listed for its throttled reads
    stalled.add(KEY)
    keeper.beat_soon()
    keeper.beat()  # due at once: no time passed since the last beat
    row = worker_record(store, "w1")
    assert row is not None and row.lease_progress[KEY].stalled and len(news) == before + 1


def test_a_checkpoint_carries_the_time_it_was_written(store: LeaseStore) -> None:
    """The operator API's checkpoint age counts from this stamp (issue 33), not from when a replica scanned."""
    clock = ManualClock()
    board = ProgressBoard(clock)
    keeper = LeaseKeeper(store, _settings("w1"), clock, Events(), progress=board.snapshot)
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    store.assign(KEY, "w1", None, None)
    _step(clock, 2.5, keeper)
    board.record(KEY, 3, 30, 0)
    assert keeper.checkpoint(KEY, Checkpoint.at("7")).applied
    row = store.get_lease(KEY)
    assert row is not None and row.checkpointed_at_millis == int(clock.time() * 1000) and row.records_processed == 3


def test_reads_throttled_in_the_last_minute_reach_the_row_and_age_out(store: LeaseStore) -> None:
    """Issue 32: the row carries a shard's throttled reads of the last minute (from the reader's running total), so
    the dashboard shows a shard at its read limit now, not since the agent started."""
    clock = ManualClock()
    totals = {KEY: 4}  # throttled before the board first saw the lease: not counted
    board = ProgressBoard(clock, throttle_totals=lambda: dict(totals))
    keeper = LeaseKeeper(store, _settings("w1"), clock, Events(), progress=board.snapshot)
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    store.assign(KEY, "w1", None, None)
    _step(clock, 2.5, keeper)

    def row_says() -> int:
        keeper.beat()
        row = worker_record(store, "w1")
        assert row is not None
        return row.lease_progress.get(KEY, NO_PROGRESS).throttled

    assert row_says() == 0
    totals[KEY] = 10
    clock.advance(20)
    assert row_says() == 6
    totals[KEY] = 13
    clock.advance(30)
    assert row_says() == 9  # 50 s since the first sample: all of it in the window
    clock.advance(45)
    assert row_says() == 3  # the sample at 0 s aged out: the growth since the one at 20 s (the newest a minute old)
    clock.advance(61)
    assert row_says() == 0 and KEY not in worker_record(store, "w1").lease_progress  # type: ignore[union-attr]


def test_a_stalled_lease_reaches_the_row_with_news_and_leaves_it_when_reads_resume(store: LeaseStore) -> None:
    """Decision 0039: the row names the leases whose reader makes no progress, so the leader can tell a fleet-wide
    stall from a local one; the row changes only when a lease starts or stops stalling, and that is news (the
    leader scans at its next tick instead of at its full-scan cadence)."""
    clock = ManualClock()
    stalled: set[str] = set()
    board = ProgressBoard(clock, stalled=lambda: frozenset(stalled))
    keeper = LeaseKeeper(store, _settings("w1"), clock, Events(), progress=board.snapshot)
    news: list[float] = []
    keeper.attach_channel(lambda: True, lambda: news.append(clock.monotonic()))
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    store.assign(KEY, "w1", None, None)
    _step(clock, 2.5, keeper)

    def row_says() -> bool:
        clock.advance(5.0)  # one heartbeat period (4 s at the defaults) and more: a row is due
        keeper.beat()
        row = worker_record(store, "w1")
        assert row is not None
        return row.lease_progress.get(KEY, NO_PROGRESS).stalled

    assert not row_says()
    told = len(news)
    stalled.add(KEY)
    assert row_says() and len(news) == told + 1
    assert row_says() and len(news) == told + 1  # still stalled: no news
    stalled.clear()
    assert not row_says() and len(news) == told + 2
    assert KEY not in worker_record(store, "w1").lease_progress  # type: ignore[union-attr]  # the row stays small


class HoldsCheckpoints(FaultyProxy):
    """Holds each checkpoint write until `release` is set (while `holding`); fails every request while `failing`."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.holding = False
        self.failing = False
        self.held = threading.Event()  # a checkpoint write is being held
        self.release = threading.Event()

    def _next_for(self, target: str, body: bytes) -> Fault | None:
        if self.holding and target.endswith(".UpdateItem") and b"checkpointSubSequenceNumber" in body:
            self.held.set()
            self.release.wait(20)
            return super()._next_for(target, body)
        return INTERNAL_ERROR if self.failing else super()._next_for(target, body)


@pytest.mark.dynamodb
def test_a_lease_fenced_while_its_checkpoint_is_in_flight_is_taken_up_again_only_after_that_write(
        moto_server: MotoServer) -> None:
    """Issue 30's covered duplicates: a row read while the write was in flight would start the next worker before it."""
    clock = ManualClock()
    with HoldsCheckpoints(moto_server.endpoint_url) as proxy:
        _, proxied = _direct_and_proxied(moto_server, proxy, "inflight", clock)
        keeper, events = _holding(proxied, "w1", clock)
        proxy.holding = True
        outcomes: list[bool] = []
        writer = threading.Thread(target=lambda: outcomes.append(keeper.checkpoint(KEY, Checkpoint.at("500")).applied))
        writer.start()
        assert proxy.held.wait(10)
        proxy.failing = True  # the store answers 500: the keeper fences the lease, its checkpoint still in flight
        _step(clock, 10, keeper)
        assert events.lost == [(KEY, LossReason.SELF_FENCED)]
        proxy.failing = False
        _step(clock, 5, keeper)  # the store answers again (a heartbeat, then discovery) and still names w1 the owner
        assert events.acquired == [KEY] and KEY not in keeper.held()  # not while the write is in flight
        proxy.release.set()
        writer.join(10)
        assert outcomes == [True]
        _step(clock, 1.5, keeper)
        assert events.acquired == [KEY, KEY] and keeper.held()[KEY].checkpoint == Checkpoint.at("500")
