"""DynamoDB retry path over real HTTP: throttling, 5xx and dropped connections from a faulty proxy in front of moto."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config

from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.clock import ManualClock
from shardherd.shared.dynamo.store import DynamoLeaseStore
from shardherd.shared.errors import StoreError, StoreUnavailable
from shardherd.shared.lease import Lease
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.store import Conflict, Fence, TableNames
from tests.support.credentials_endpoint import CredentialsEndpoint
from tests.support.faulty_proxy import DROPPED, INTERNAL_ERROR, REPLY_LOST, THROTTLED, Fault, FaultyProxy
from tests.support.stores import unique_app

ATTEMPTS = 4


def single_attempt_client(endpoint_url: str) -> Any:
    """A client that never retries by itself, so every retry counted here is the store's own."""
    return boto3.client("dynamodb", region_name="us-east-1", endpoint_url=endpoint_url,
                        aws_access_key_id="local", aws_secret_access_key="local",
                        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))


@pytest.fixture
def tables(dynamodb_client: Any) -> TableNames:
    names = TableNames.for_application(unique_app("retry"))
    DynamoLeaseStore(dynamodb_client, names).ensure_tables()
    return names


@pytest.fixture
def proxy(moto_server: Any) -> Iterator[FaultyProxy]:
    with FaultyProxy(moto_server.endpoint_url) as running:
        yield running


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(proxy: FaultyProxy, tables: TableNames, clock: ManualClock) -> Iterator[DynamoLeaseStore]:
    retry = RetryPolicy(max_attempts=ATTEMPTS, base_delay=0.1, max_delay=1.0, clock=clock, rng=random.Random(7))
    opened = DynamoLeaseStore(single_attempt_client(proxy.endpoint_url), tables, retry=retry)
    yield opened
    opened.close()


def test_throttling_and_server_errors_are_retried_until_success(store: DynamoLeaseStore, proxy: FaultyProxy,
                                                                clock: ManualClock,
                                                                dynamodb_client: Any) -> None:
    proxy.add([THROTTLED, INTERNAL_ERROR, DROPPED])
    start = clock.monotonic()

    outcome = store.create_lease(Lease("shardId-1", lease_owner="w1"))

    assert outcome.applied
    assert proxy.faults_served == 3 and proxy.forwarded == ["DynamoDB_20120810.PutItem"]
    assert clock.monotonic() > start  # backed off on the injected clock, never really slept
    stored = dynamodb_client.get_item(TableName=store.tables.leases, Key={"leaseKey": {"S": "shardId-1"}})
    assert stored["Item"]["leaseOwner"] == {"S": "w1"}


def test_faults_outlasting_the_budget_raise_store_unavailable(store: DynamoLeaseStore, proxy: FaultyProxy) -> None:
    proxy.add([THROTTLED, INTERNAL_ERROR] * 10)
    with pytest.raises(StoreUnavailable, match=rf"UpdateItem renew shardId-1 failed {ATTEMPTS} times"):
        store.renew("shardId-1", "w1", 0)
    assert proxy.faults_served == ATTEMPTS and proxy.forwarded == []


def test_non_transient_errors_are_not_retried(store: DynamoLeaseStore, proxy: FaultyProxy) -> None:
    proxy.add([Fault(400, "ValidationException")])
    with pytest.raises(StoreError, match="ValidationException") as raised:
        store.get_lease("shardId-1")
    assert not isinstance(raised.value, StoreUnavailable)
    assert proxy.requests == 1


def test_missing_table_is_a_clear_error(proxy: FaultyProxy, clock: ManualClock) -> None:
    store = DynamoLeaseStore(single_attempt_client(proxy.endpoint_url),
                             TableNames.for_application(unique_app("absent")), retry=RetryPolicy(clock=clock))
    with pytest.raises(StoreError, match="ResourceNotFoundException"):
        store.scan_leases()
    assert proxy.requests == 1


def test_scan_pages_survive_throttling_between_pages(store: DynamoLeaseStore, proxy: FaultyProxy) -> None:
    for index in range(5):
        assert store.create_lease(Lease(f"shardId-{index}")).applied
    proxy.add([None, THROTTLED, None, INTERNAL_ERROR])  # page 1 ok, page 2 throttled once, page 3 fails once

    scan = store.scan_leases(page_size=2)

    assert sorted(lease.lease_key for lease in scan.leases) == [f"shardId-{i}" for i in range(5)]
    assert proxy.faults_served == 2
    assert proxy.forwarded[-3:] == ["DynamoDB_20120810.Scan"] * 3


def test_lost_race_returns_the_current_row_in_one_request(store: DynamoLeaseStore, proxy: FaultyProxy) -> None:
    assert store.create_lease(Lease("shardId-1", lease_owner="w1")).applied
    assert store.renew("shardId-1", "w1", 0).applied
    before = proxy.requests

    outcome = store.renew("shardId-1", "w1", 0)  # stale counter

    assert not outcome.applied and outcome.conflict is Conflict.OWNERSHIP
    assert outcome.lease is not None and outcome.lease.lease_counter == 1
    assert proxy.requests == before + 1  # ALL_OLD on the failed condition: no extra GetItem


def test_transaction_conflicts_are_retried(store: DynamoLeaseStore, proxy: FaultyProxy) -> None:
    assert store.create_lease(Lease("shardId-1", lease_owner="w1")).applied
    assert store.put_state("Leader", {"ownerName": "leader-1"})
    conflict = Fault(400, "TransactionCanceledException",
                     {"CancellationReasons": [{"Code": "None"}, {"Code": "TransactionConflict"}]})
    proxy.add([conflict])

    outcome = store.assign("shardId-1", "w2", "w1", None, Fence("Leader", {"ownerName": "leader-1"}))

    assert outcome.applied and outcome.lease is not None and outcome.lease.lease_owner == "w2"
    assert proxy.faults_served == 1


def test_failed_fence_is_fenced_and_writes_nothing(store: DynamoLeaseStore) -> None:
    assert store.create_lease(Lease("shardId-1", lease_owner="w1", checkpoint=Checkpoint.at(5))).applied
    assert store.put_state("Leader", {"ownerName": "leader-2"})
    fence = Fence("Leader", {"ownerName": "leader-1"})

    outcome = store.delete_lease("shardId-1", Checkpoint.at(5), fence)

    assert not outcome.applied and outcome.conflict is Conflict.FENCED
    assert store.get_lease("shardId-1") == outcome.lease


def test_renew_whose_reply_was_lost_counts_as_applied(store: DynamoLeaseStore, proxy: FaultyProxy) -> None:
    assert store.create_lease(Lease("shardId-1", lease_owner="w1")).applied
    proxy.add([REPLY_LOST])  # the first UpdateItem is applied by moto, but the connection drops before the reply

    outcome = store.renew("shardId-1", "w1", 0, throughput_kbps=2.5)

    assert outcome.applied and outcome.lease is not None
    assert outcome.lease.lease_counter == 1 and outcome.lease.throughput_kbps == 2.5
    assert proxy.forwarded.count("DynamoDB_20120810.UpdateItem") == 2


def test_release_whose_reply_was_lost_counts_as_applied(store: DynamoLeaseStore, proxy: FaultyProxy) -> None:
    """The owner is told it released the lease (its processor is shut down, not told the lease was lost)."""
    assert store.create_lease(Lease("shardId-1", lease_owner="w1")).applied
    proxy.add([REPLY_LOST])

    outcome = store.release("shardId-1", "w1")

    assert outcome.applied and outcome.lease is not None and outcome.lease.released
    assert proxy.forwarded.count("DynamoDB_20120810.UpdateItem") == 2


def test_a_handoff_completion_whose_reply_was_lost_counts_as_applied(store: DynamoLeaseStore,
                                                                     proxy: FaultyProxy) -> None:
    """The old owner is told it handed the lease off (before: taken, as if another worker had taken it)."""
    assert store.create_lease(Lease("shardId-1", lease_owner="w1")).applied
    assert store.start_handoff("shardId-1", "w2", "w1").applied
    proxy.add([REPLY_LOST])

    outcome = store.complete_handoff("shardId-1", "w1")

    assert outcome.applied and outcome.lease is not None, outcome
    assert outcome.lease.lease_owner == "w2" and outcome.lease.checkpoint_owner is None
    assert proxy.forwarded.count("DynamoDB_20120810.UpdateItem") == 3  # the handoff's start, the completion twice


def test_a_final_handoff_checkpoint_whose_reply_was_lost_counts_as_applied(store: DynamoLeaseStore,
                                                                           proxy: FaultyProxy) -> None:
    """The checkpoint that completes a handoff landed; the retry finds the lease the new owner's (before: OWNERSHIP)."""
    assert store.create_lease(Lease("shardId-1", lease_owner="w1")).applied
    assert store.start_handoff("shardId-1", "w2", "w1").applied
    proxy.add([None, REPLY_LOST])  # the checkpoint's read of the row, then its UpdateItem

    outcome = store.checkpoint("shardId-1", "w1", Checkpoint.at(7), hand_over=True)

    assert outcome.applied and outcome.lease is not None, outcome
    assert outcome.lease.checkpoint == Checkpoint.at(7) and outcome.lease.checkpoint_owner is None
    assert outcome.lease.lease_owner == "w2"
    assert proxy.forwarded.count("DynamoDB_20120810.UpdateItem") == 3  # the handoff's start, the checkpoint twice


def test_a_real_lost_renew_is_not_mistaken_for_a_lost_reply(store: DynamoLeaseStore, proxy: FaultyProxy) -> None:
    assert store.create_lease(Lease("shardId-1", lease_owner="w1")).applied
    assert store.assign("shardId-1", "w2", "w1", None).applied  # w2 now holds it at counter 1
    proxy.add([DROPPED])

    outcome = store.renew("shardId-1", "w1", 0)

    assert not outcome.applied and outcome.conflict is Conflict.OWNERSHIP
    assert outcome.lease is not None and outcome.lease.lease_owner == "w2"


def test_an_owner_s_checkpoint_from_the_row_it_saw_is_one_request(dynamodb_client: Any, tables: TableNames) -> None:
    # A Spark driver checkpoints every held shard each micro-batch: a read before each write doubled that traffic.
    store = DynamoLeaseStore(dynamodb_client, tables)
    store.create_lease(Lease(lease_key="shardId-1", checkpoint=Checkpoint.at("1")))
    seen = store.assign("shardId-1", "w1", None, None).lease
    calls: list[str] = []
    dynamodb_client.meta.events.register("before-call.dynamodb.*",
                                         lambda model, **_: calls.append(model.name))  # botocore's own hook
    written = store.checkpoint("shardId-1", "w1", Checkpoint.at("5"), expected=seen)
    assert written.applied and calls == ["UpdateItem"]
    calls.clear()
    assert store.checkpoint("shardId-1", "w1", Checkpoint.at("9")).applied
    assert calls == ["GetItem", "UpdateItem"]  # without the row: read first


def test_a_checkpoint_the_stored_one_keeps_moving_under_is_unavailable_not_a_lost_lease(
        dynamodb_client: Any, tables: TableNames, moto_server: Any) -> None:
    # Another writer of the same owner (a second thread of its driver) moves the stored checkpoint before each of
    # this writer's attempts, through its own client: every conditional write fails while the lease stays w1's.
    # OWNERSHIP here made the keeper drop a lease it still owned until rediscovery.
    store, rival = DynamoLeaseStore(dynamodb_client, tables), DynamoLeaseStore(single_attempt_client(
        moto_server.endpoint_url), tables)
    assert store.create_lease(Lease("shardId-1", lease_owner="w1", checkpoint=Checkpoint.at("100"))).applied
    rival_positions = iter(range(101, 200))

    def rival_moves_it(model: Any, **_: Any) -> None:
        assert rival.checkpoint("shardId-1", "w1", Checkpoint.at(str(next(rival_positions)))).applied

    dynamodb_client.meta.events.register("before-call.dynamodb.UpdateItem", rival_moves_it)  # botocore's own hook
    try:
        with pytest.raises(StoreUnavailable, match="still w1's"):
            store.checkpoint("shardId-1", "w1", Checkpoint.at("500"))
    finally:
        dynamodb_client.meta.events.unregister("before-call.dynamodb.UpdateItem", rival_moves_it)
    row = rival.get_lease("shardId-1")
    assert row is not None and row.lease_owner == "w1"
    assert row.checkpoint == Checkpoint.at(str(next(rival_positions) - 1))  # the rival's last write, nothing lost
    assert store.checkpoint("shardId-1", "w1", Checkpoint.at("500")).applied  # once the rival stops, it goes through


def test_credentials_that_cannot_be_refreshed_are_an_outage_not_a_permanent_error(
        moto_server: Any, tables: TableNames, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30 fault matrix: a credential source failing while credentials are due for refresh made every store call
    a StoreError, and every agent and replica exited at once; it is StoreUnavailable, and calls work once it heals."""
    with CredentialsEndpoint() as endpoint:
        for name, value in endpoint.env().items():
            monkeypatch.setenv(name, value)
        retry = RetryPolicy(max_attempts=ATTEMPTS, base_delay=0.01, max_delay=0.05, rng=random.Random(7))
        store = DynamoLeaseStore(make_client("dynamodb", "us-east-1", moto_server.endpoint_url), tables, retry=retry)
        try:
            assert store.get_lease("none") is None and endpoint.served >= 1  # credentials from the endpoint
            endpoint.failing = True
            with pytest.raises(StoreUnavailable, match="credentials"):
                store.get_lease("none")
            assert endpoint.refused >= ATTEMPTS  # each attempt tried to refresh
            endpoint.failing = False
            assert store.get_lease("none") is None
        finally:
            store.close()
