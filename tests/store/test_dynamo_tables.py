"""DynamoDB table creation: KCL key schemas, the owner index (also added to a KCL 2.x table), idempotence, waiting."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shardherd.shared.aws import make_client
from shardherd.shared.clock import ManualClock
from shardherd.shared.dynamo.store import DynamoLeaseStore
from shardherd.shared.dynamo.tables import Capacity, TableManager
from shardherd.shared.errors import ConfigError, StoreError
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.store import LEASE_OWNER_INDEX, TableNames
from tests.support.faulty_proxy import Fault, FaultyProxy
from tests.support.stores import unique_app


def describe(client: Any, name: str) -> dict[str, Any]:
    table: dict[str, Any] = client.describe_table(TableName=name)["Table"]
    return table


def owner_index(description: dict[str, Any]) -> dict[str, Any]:
    (index,) = [i for i in description["GlobalSecondaryIndexes"] if i["IndexName"] == LEASE_OWNER_INDEX]
    found: dict[str, Any] = index
    return found


def kcl_lease(key: str, owner: str) -> dict[str, Any]:
    return {"leaseKey": {"S": key}, "leaseOwner": {"S": owner}, "leaseCounter": {"N": "3"},
            "ownerSwitchesSinceCheckpoint": {"N": "0"}, "checkpoint": {"S": "TRIM_HORIZON"},
            "checkpointSubSequenceNumber": {"N": "0"}}


def test_creates_the_three_kcl_tables_on_demand(dynamodb_client: Any) -> None:
    tables = TableNames.for_application(unique_app("tables"))
    DynamoLeaseStore(dynamodb_client, tables).ensure_tables()

    leases = describe(dynamodb_client, tables.leases)
    assert leases["KeySchema"] == [{"AttributeName": "leaseKey", "KeyType": "HASH"}]
    assert leases["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    index = owner_index(leases)
    assert index["KeySchema"] == [{"AttributeName": "leaseOwner", "KeyType": "HASH"},
                                  {"AttributeName": "leaseKey", "KeyType": "RANGE"}]
    assert index["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    for name, key in ((tables.worker_metrics, "wid"), (tables.coordinator_state, "key")):
        table = describe(dynamodb_client, name)
        assert table["KeySchema"] == [{"AttributeName": key, "KeyType": "HASH"}]
        assert table["TableStatus"] == "ACTIVE"
    assert tables.worker_metrics.endswith("-WorkerMetricStats")


def test_ensure_tables_is_idempotent_and_keeps_data(dynamodb_client: Any) -> None:
    tables = TableNames.for_application(unique_app("idem"))
    store = DynamoLeaseStore(dynamodb_client, tables)
    store.ensure_tables()
    dynamodb_client.put_item(TableName=tables.leases, Item=kcl_lease("shardId-1", "w1"))
    before = {name: describe(dynamodb_client, name)["CreationDateTime"]
              for name in (tables.leases, tables.worker_metrics, tables.coordinator_state)}

    store.ensure_tables()
    DynamoLeaseStore(dynamodb_client, tables).ensure_tables()

    after = {name: describe(dynamodb_client, name)["CreationDateTime"] for name in before}
    assert after == before
    assert store.list_owned_keys("w1") == ["shardId-1"]


def test_provisioned_billing_applies_to_tables_and_index(dynamodb_client: Any) -> None:
    tables = TableNames.for_application(unique_app("prov"))
    DynamoLeaseStore(dynamodb_client, tables, billing_mode="PROVISIONED", read_capacity=3,
                     write_capacity=4).ensure_tables()
    leases = describe(dynamodb_client, tables.leases)
    assert leases["ProvisionedThroughput"]["ReadCapacityUnits"] == 3
    assert leases["ProvisionedThroughput"]["WriteCapacityUnits"] == 4
    assert owner_index(leases)["ProvisionedThroughput"]["WriteCapacityUnits"] == 4
    assert describe(dynamodb_client, tables.coordinator_state)["ProvisionedThroughput"]["ReadCapacityUnits"] == 3


@pytest.mark.parametrize(("mode", "read", "write", "message"), [
    ("ON_DEMAND", 10, 10, "billing_mode"),
    ("PROVISIONED", 0, 10, "capacity"),
])
def test_bad_billing_settings_are_rejected(mode: str, read: int, write: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Capacity(mode, read, write)


def test_owner_index_is_added_to_a_kcl_2x_table(dynamodb_client: Any) -> None:
    tables = TableNames.for_application(unique_app("kcl2"))
    dynamodb_client.create_table(
        TableName=tables.leases, KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PROVISIONED", ProvisionedThroughput={"ReadCapacityUnits": 5, "WriteCapacityUnits": 6})
    for number in range(7):
        dynamodb_client.put_item(TableName=tables.leases, Item=kcl_lease(f"shardId-{number:03d}", f"w{number % 2}"))

    store = DynamoLeaseStore(dynamodb_client, tables)
    store.ensure_tables()

    index = owner_index(describe(dynamodb_client, tables.leases))
    assert index["IndexStatus"] == "ACTIVE"
    assert index["ProvisionedThroughput"]["ReadCapacityUnits"] == 5  # copies the base table's capacity, like KCL
    assert store.list_owned_keys("w0") == ["shardId-000", "shardId-002", "shardId-004", "shardId-006"]
    store.owner_query_page_size = 2  # the query must follow every page
    assert store.list_owned_keys("w1") == ["shardId-001", "shardId-003", "shardId-005"]
    assert store.list_owned_keys("nobody") == []


# ------------------------------------------------------------------------------------------ waiting for ACTIVE
def creating_description(name: str) -> Fault:
    """A DescribeTable reply saying the table and its index are still being created."""
    table = {"TableName": name, "TableStatus": "CREATING",
             "GlobalSecondaryIndexes": [{"IndexName": LEASE_OWNER_INDEX, "IndexStatus": "CREATING"}]}
    return Fault(200, extra={"Table": table})


@pytest.fixture
def proxy(moto_server: Any) -> Iterator[FaultyProxy]:
    with FaultyProxy(moto_server.endpoint_url) as running:
        yield running


def test_waits_until_tables_are_active(proxy: FaultyProxy) -> None:
    tables = TableNames.for_application(unique_app("wait"))
    clock = ManualClock()
    manager = TableManager(make_client("dynamodb", "us-east-1", proxy.endpoint_url), tables,
                           RetryPolicy(clock=clock), Capacity(), timeout=60, poll_interval=2)
    manager.ensure_all()  # creates the tables for real
    proxy.add([creating_description(tables.leases)] * 6)
    start = clock.monotonic()

    manager.ensure_all()

    assert proxy.faults_served == 6
    # Three describes check that the tables exist; the other three see CREATING and each sleep one poll interval.
    assert clock.monotonic() - start == pytest.approx(3 * 2)


def test_gives_up_when_tables_stay_creating(proxy: FaultyProxy) -> None:
    tables = TableNames.for_application(unique_app("stuck"))
    clock = ManualClock()
    manager = TableManager(make_client("dynamodb", "us-east-1", proxy.endpoint_url), tables,
                           RetryPolicy(clock=clock), Capacity(), timeout=10, poll_interval=1)
    proxy.add([creating_description(tables.leases)] * 100)
    with pytest.raises(StoreError, match=rf"table {tables.leases} not ACTIVE after 10 s"):
        manager.ensure_all()
    assert clock.monotonic() - 1000.0 == pytest.approx(10)
    assert proxy.forwarded == []
