"""Rewind on kinesalite and a real lease keeper: positions at a time, fenced rewrite, one at a time, bad input."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from shardherd.agent.lease_keeper import LeaseKeeper, LossReason
from shardherd.coordinator.rewind import RUNNING_KEY, Rewinder, RewindRequest, history
from shardherd.coordinator.rewind_positions import HELD_BACK_NOTE, Found, parse_sequences, parse_time, position_at
from shardherd.coordinator.rewind_probe import THROTTLE_WAITS, unthrottled
from shardherd.coordinator.shard_sync import plan_shard_sync
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import SHARD_END, TRIM_HORIZON, Checkpoint
from shardherd.shared.clock import ManualClock, SystemClock
from shardherd.shared.config import load_settings
from shardherd.shared.dynamo.store import DynamoLeaseStore
from shardherd.shared.lease import Lease, new_lease
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.pause import BadControlRequest
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.shard_lister import list_shards
from shardherd.shared.shards import Shard
from shardherd.shared.store import LeaseStore, TableNames
from shardherd.shared.streams import StreamIdentifier
from tests.support.faulty_proxy import REPLY_LOST, Fault, FaultyProxy
from tests.support.stores import unique_app
from tests.support.stream_stack import active_stream
from tests.support.waiting import wait_for


class Owner:
    """A listener standing for an agent: stops at once when asked (as a shard worker does after its batch)."""

    def __init__(self) -> None:
        self.keeper: LeaseKeeper | None = None
        self.acquired: list[Checkpoint] = []
        self.lost: list[LossReason] = []

    def lease_acquired(self, lease: Lease) -> None:
        self.acquired.append(lease.checkpoint)

    def leases_awaited(self, lease_keys: frozenset[str]) -> None:
        pass

    def handoff_requested(self, lease: Lease) -> None:
        assert self.keeper is not None
        self.keeper.finish_handoff(lease.lease_key)

    def lease_lost(self, lease_key: str, reason: LossReason) -> None:
        self.lost.append(reason)


@pytest.fixture
def stream(kinesis: Any) -> Iterator[tuple[str, list[str], datetime]]:
    """One shard with 5 records, a pause of 1.5 s, then 5 more: (stream, their sequence numbers, the gap's middle)."""
    name = f"rewind-{uuid.uuid4().hex[:8]}"
    active_stream(kinesis, name, 1)
    sequences = [kinesis.put_record(StreamName=name, Data=b"early", PartitionKey=str(i))["SequenceNumber"]
                 for i in range(5)]
    time.sleep(0.75)
    middle = datetime.now(UTC)
    time.sleep(0.75)
    sequences += [kinesis.put_record(StreamName=name, Data=b"late", PartitionKey=str(i))["SequenceNumber"]
                  for i in range(5)]
    yield name, sequences, middle
    kinesis.delete_stream(StreamName=name)


def _owned(stream: str, kinesis: Any, store: LeaseStore | None = None
           ) -> tuple[LeaseStore, Rewinder, Owner, threading.Event]:
    """The shard's lease at its last record (in `store`, else a memory store), held by a live keeper on a thread."""
    settings = load_settings(worker_id="w1", application_name="rewind-test", stream_name=stream,
                             failover_time_millis=3000, discovery_interval_millis=200)
    store = store or MemoryLeaseStore(TableNames.for_application("rewind-test"))
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    store.create_lease(new_lease(shard, TRIM_HORIZON))
    store.assign(shard, "w1", None, None)
    owner = Owner()
    owner.keeper = LeaseKeeper(store, settings, SystemClock(), owner)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.05):
            assert owner.keeper is not None
            owner.keeper.tick()

    threading.Thread(target=tick, daemon=True).start()
    rewinder = Rewinder(store, kinesis, settings, SystemClock(), lambda worker: None)
    return store, rewinder, owner, stop


def test_rewind_to_a_time_restarts_after_the_last_record_before_it(
        kinesis: Any, stream: tuple[str, list[str], datetime]) -> None:
    name, sequences, middle = stream
    store, rewinder, owner, stop = _owned(name, kinesis)
    try:
        shard = store.scan_leases().leases[0].lease_key
        deadline = time.monotonic() + 10
        while not owner.acquired and time.monotonic() < deadline:
            time.sleep(0.05)
        assert owner.keeper is not None and owner.keeper.checkpoint(shard, Checkpoint.at(sequences[-1])).applied
        dry = rewinder.run(RewindRequest(who="test", to=middle.isoformat(), dry_run=True))
        assert [row.after for row in dry.rows] == [sequences[4]]
        stored = store.get_lease(shard)
        assert stored is not None and stored.checkpoint == Checkpoint.at(sequences[-1])  # a dry run writes nothing
        record = rewinder.run(RewindRequest(who="test", to=middle.isoformat()))
        assert record.outcome == "done" and record.rows[0].before == sequences[-1]
        row = store.get_lease(shard)
        assert row is not None and row.checkpoint == Checkpoint.at(sequences[4]) and not row.is_paused
        assert LossReason.PAUSED in owner.lost  # it stopped before the rewrite ...
        while owner.acquired[-1] != Checkpoint.at(sequences[4]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert owner.acquired[-1] == Checkpoint.at(sequences[4])  # ... and restarted from the rewritten checkpoint
        assert [kept.rewind_id for kept in history(store)] == [record.rewind_id]
        assert store.get_state(RUNNING_KEY) is None
    finally:
        stop.set()


class _LosesRunningReply(FaultyProxy):
    """Applies the first write of the running-rewind item, then drops its connection unanswered."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.lost = 0

    def _next_for(self, target: str, body: bytes) -> Fault | None:
        if not self.lost and target.endswith(".PutItem") and RUNNING_KEY.encode() in body:
            self.lost += 1
            return REPLY_LOST
        return self._next(target)


def test_a_start_whose_reply_was_lost_runs_the_rewind(kinesis: Any, stream: tuple[str, list[str], datetime],
                                                       moto_server: MotoServer) -> None:
    """The store retries the put of the running item, which fails on itself: the rewind is still this one's."""
    name, sequences, middle = stream
    with _LosesRunningReply(moto_server.endpoint_url) as proxy:
        dynamo = DynamoLeaseStore(make_client("dynamodb", "us-east-1", proxy.endpoint_url),
                                  TableNames.for_application(unique_app("rewind")))
        dynamo.ensure_tables()
        store, rewinder, owner, stop = _owned(name, kinesis, dynamo)
        try:
            wait_for(lambda: bool(owner.acquired), 10, "the keeper holds the lease")
            record = rewinder.run(RewindRequest(who="test", to=middle.isoformat()))
            assert proxy.lost == 1 and record.outcome == "done"
            assert [row.after for row in record.rows] == [sequences[4]]
            assert store.get_state(RUNNING_KEY) is None, "the run's own item is gone: the next rewind may start"
        finally:
            stop.set()
            dynamo.close()


def test_bad_input_and_a_running_rewind_write_nothing(kinesis: Any, stream: tuple[str, list[str], datetime]) -> None:
    name, _, middle = stream
    store, rewinder, _, stop = _owned(name, kinesis)
    stop.set()
    before = store.scan_leases().leases
    future = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    for request, message in ((RewindRequest(who="t", to=future), "in the future"),
                             (RewindRequest(who="t", to=middle.isoformat(), shards=["shardId-9"]), "no lease"),
                             (RewindRequest(who="t"), "either --to"),
                             (RewindRequest(who="t", to="yesterday"), "ISO 8601")):
        with pytest.raises(BadControlRequest, match=message):
            rewinder.run(request)
    store.put_state(RUNNING_KEY, {"id": "other", "who": "someone", "started": str(time.time())})
    with pytest.raises(BadControlRequest, match="rewind other by someone is running"):
        rewinder.run(RewindRequest(who="t", to=middle.isoformat()))
    assert store.scan_leases().leases == before and history(store) == []


def test_positions_follow_the_records_around_the_time() -> None:
    last = Checkpoint.at("42", 3)
    assert position_at(Found(last, any_after=True, closed=False, before_retention=False)) == (last, "after 42/3")
    assert position_at(Found(last, any_after=False, closed=True, before_retention=False))[0] == SHARD_END
    assert position_at(Found(last, any_after=False, closed=False, before_retention=False))[0] == last
    checkpoint, note = position_at(Found(None, any_after=True, closed=False, before_retention=True))
    assert checkpoint == TRIM_HORIZON and "retention" in note
    assert parse_time("2026-01-01T00:00:00", now=2e9).tzinfo is not None
    assert parse_sequences(["shardId-1=77"]) == {"shardId-1": Checkpoint.at("77")}
    with pytest.raises(BadControlRequest):
        parse_sequences(["shardId-1"])


def test_a_throttled_probe_call_is_retried_after_a_growing_wait_and_other_errors_are_not() -> None:
    """The shard's 5 GetRecords calls/s are shared with its readers: the rewind's probe waits and retries a refusal
    (test_up's rewind through the limits proxy failed on the first ProvisionedThroughputExceededException)."""
    clock = ManualClock()
    answers: list[Exception | str] = [_refusal("ProvisionedThroughputExceededException"),
                                      _refusal("LimitExceededException"), "read"]

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    started = clock.monotonic()
    assert unthrottled(call, clock) == "read"
    assert clock.monotonic() - started == pytest.approx(THROTTLE_WAITS[0] + THROTTLE_WAITS[1])
    answers[:] = [_refusal("ResourceNotFoundException")]
    with pytest.raises(ClientError):  # not throttling: raised at once
        unthrottled(call, clock)
    answers[:] = [_refusal("ProvisionedThroughputExceededException")] * (len(THROTTLE_WAITS) + 1)
    with pytest.raises(ClientError):  # still throttled after every wait: the last refusal is raised
        unthrottled(call, clock)
    assert answers == []


def _refusal(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "Rate exceeded for Shard"}}, "GetRecords")


@pytest.mark.parametrize("multi_stream", [False, True], ids=["single-stream", "multi-stream-parent-cleaned-up"])
def test_a_rewind_before_a_split_holds_the_children_back_until_their_parent_ends_again(
        kinesis: Any, multi_stream: bool) -> None:
    """A parent reopened by a rewind is read again before its children: their leases wait for its end (decision
    0031). Before, both children restarted at TRIM_HORIZON beside the rewound parent, so child records were
    delivered before the parent's records after the time. Multi-stream: the parent's finished lease was already
    deleted by shard sync, and the rewind creates it again under its stream's key (before, only single-stream
    applications got it back)."""
    name = f"rewind-split-{uuid.uuid4().hex[:8]}"
    active_stream(kinesis, name, 1)
    parent = kinesis.list_shards(StreamName=name)["Shards"][0]
    before = [kinesis.put_record(StreamName=name, Data=b"old", PartitionKey=str(i))["SequenceNumber"]
              for i in range(3)]
    time.sleep(0.75)
    middle = datetime.now(UTC)
    time.sleep(0.75)
    kinesis.put_record(StreamName=name, Data=b"parent, after the time", PartitionKey="p")
    high = int(parent["HashKeyRange"]["EndingHashKey"])
    kinesis.split_shard(StreamName=name, ShardToSplit=parent["ShardId"], NewStartingHashKey=str(high // 2 + 1))
    wait_for(lambda: kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamStatus"]
             == "ACTIVE", 30, "the split")
    shards = listed(kinesis, name)
    children = sorted(shard.shard_id for shard in shards if shard.shard_id != parent["ShardId"])
    stream = StreamIdentifier("123456789012", name, 1700000000) if multi_stream else None

    def key(shard: str) -> str:
        return shard if stream is None else stream.lease_key(shard)

    def keyed(lease: Lease) -> Lease:
        return lease if stream is None else lease.with_changes(
            lease_key=stream.lease_key(lease.lease_key), stream_name=stream.serialized, shard_id=lease.lease_key)

    store = MemoryLeaseStore(TableNames.for_application("rewind-split"))
    if not multi_stream:  # multi-stream: shard sync already deleted the finished parent
        store.create_lease(new_lease(parent["ShardId"], SHARD_END))
    for child in children:  # read some way: each at a record of its own
        low = next(shard for shard in shards if shard.shard_id == child).hash_range[0]
        sequence = kinesis.put_record(StreamName=name, Data=b"child", PartitionKey="c",
                                      ExplicitHashKey=str(low))["SequenceNumber"]
        store.create_lease(keyed(new_lease(child, Checkpoint.at(sequence), frozenset({parent["ShardId"]}))))
    streams = {"streams": [{"name": name, "account_id": "123456789012", "creation_epoch": 1700000000}]} \
        if multi_stream else {"stream_name": name}
    settings = load_settings(worker_id="op", application_name="rewind-split", **streams)
    record = Rewinder(store, kinesis, settings, SystemClock(), lambda worker: None).run(
        RewindRequest(who="test", to=middle.isoformat()))

    assert record.outcome == "done", record
    rows = {row.shard: row for row in record.rows}
    assert rows[parent["ShardId"]].after == before[-1]
    assert all(HELD_BACK_NOTE in rows[child].note for child in children), rows
    assert [lease.lease_key for lease in store.scan_leases().leases] == [key(parent["ShardId"])]
    local = [lease.with_changes(lease_key=lease.shard, stream_name=None, shard_id=None)
             for lease in store.scan_leases().leases]
    assert plan_shard_sync(shards, local, "TRIM_HORIZON").creates == ()  # the parent is open again
    store.assign(key(parent["ShardId"]), "w1", None, None)
    assert store.checkpoint(key(parent["ShardId"]), "w1", SHARD_END).applied  # read to its end again
    local = [lease.with_changes(lease_key=lease.shard, stream_name=None, shard_id=None)
             for lease in store.scan_leases().leases]
    creates = plan_shard_sync(shards, local, "TRIM_HORIZON").creates
    assert sorted((c.lease.lease_key, c.lease.checkpoint) for c in creates) == [(c, TRIM_HORIZON) for c in children]


def listed(kinesis: Any, name: str) -> list[Shard]:
    """The stream's shards as the coordinator lists them."""
    return list_shards(kinesis, name, RetryPolicy())
