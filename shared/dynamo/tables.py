"""Creates the lease, worker-metrics and coordinator-state tables (KCL's key schemas) and waits until usable."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from shardherd.shared.dynamo.errors import call, error_code
from shardherd.shared.dynamo.lease_codec import LEASE_KEY, LEASE_OWNER
from shardherd.shared.dynamo.worker_codec import WORKER_ID
from shardherd.shared.errors import ConfigError, StoreError
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.store import LEASE_OWNER_INDEX, STATE_KEY_ATTRIBUTE, TableNames

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

BILLING_MODES = ("PAY_PER_REQUEST", "PROVISIONED")
ACTIVE = "ACTIVE"


@dataclass(frozen=True, slots=True)
class Capacity:
    """Billing of the tables shardherd creates: on-demand, or provisioned with read/write capacity units."""

    billing_mode: str = "PAY_PER_REQUEST"
    read_capacity: int = 10
    write_capacity: int = 10

    def __post_init__(self) -> None:
        problems = []
        if self.billing_mode not in BILLING_MODES:
            problems.append(f"billing_mode must be one of {BILLING_MODES}, got {self.billing_mode!r}")
        if self.read_capacity < 1 or self.write_capacity < 1:
            problems.append(f"read/write capacity must be >= 1, got {self.read_capacity}/{self.write_capacity}")
        if problems:
            raise ConfigError("; ".join(problems))

    def table_params(self) -> dict[str, Any]:
        """The billing parameters of CreateTable."""
        if self.billing_mode == "PAY_PER_REQUEST":
            return {"BillingMode": "PAY_PER_REQUEST"}
        return {"BillingMode": "PROVISIONED", "ProvisionedThroughput": self.throughput()}

    def throughput(self) -> dict[str, int]:
        """The ProvisionedThroughput block."""
        return {"ReadCapacityUnits": self.read_capacity, "WriteCapacityUnits": self.write_capacity}


def owner_index(capacity: Capacity) -> dict[str, Any]:
    """The `LeaseOwnerToLeaseKeyIndex` GSI: HASH leaseOwner, RANGE leaseKey, KEYS_ONLY."""
    index: dict[str, Any] = {
        "IndexName": LEASE_OWNER_INDEX,
        "KeySchema": [{"AttributeName": LEASE_OWNER, "KeyType": "HASH"},
                      {"AttributeName": LEASE_KEY, "KeyType": "RANGE"}],
        "Projection": {"ProjectionType": "KEYS_ONLY"},
    }
    if capacity.billing_mode == "PROVISIONED":
        index["ProvisionedThroughput"] = capacity.throughput()
    return index


class TableManager:
    """Idempotent creation of an application's three tables; polls DescribeTable on the retry policy's clock."""

    def __init__(self, client: DynamoDBClient, tables: TableNames, retry: RetryPolicy, capacity: Capacity,
                 timeout: float = 3600.0, poll_interval: float = 1.0) -> None:
        self._client = client
        self._tables = tables
        self._retry = retry
        self._capacity = capacity
        self._timeout = timeout
        self._poll_interval = poll_interval

    def ensure_all(self) -> None:
        """Create whatever is missing (the GSI on an old lease table too), then wait until everything is ACTIVE."""
        self._ensure_lease_table()
        self._ensure_hash_table(self._tables.worker_metrics, WORKER_ID)
        self._ensure_hash_table(self._tables.coordinator_state, STATE_KEY_ATTRIBUTE)
        for name in (self._tables.leases, self._tables.worker_metrics, self._tables.coordinator_state):
            self._wait_active(name)

    def describe(self, name: str) -> dict[str, Any] | None:
        """The table description, or None when the table does not exist."""
        try:
            response = call(self._retry, lambda: self._client.describe_table(TableName=name),
                            f"DescribeTable {name}")
        except StoreError as exc:
            cause = exc.__cause__
            if isinstance(cause, ClientError) and error_code(cause) == "ResourceNotFoundException":
                return None
            raise
        return dict(response["Table"])

    def _create(self, name: str, params: dict[str, Any]) -> None:
        """CreateTable, treating a concurrent creator's table as success."""
        try:
            call(self._retry, lambda: self._client.create_table(TableName=name, **params), f"CreateTable {name}")
        except StoreError as exc:
            cause = exc.__cause__
            if not (isinstance(cause, ClientError) and error_code(cause) == "ResourceInUseException"):
                raise

    def _ensure_hash_table(self, name: str, hash_key: str) -> None:
        if self.describe(name) is not None:
            return
        self._create(name, {
            "AttributeDefinitions": [{"AttributeName": hash_key, "AttributeType": "S"}],
            "KeySchema": [{"AttributeName": hash_key, "KeyType": "HASH"}],
            **self._capacity.table_params(),
        })

    def _ensure_lease_table(self) -> None:
        name = self._tables.leases
        attributes = [{"AttributeName": LEASE_KEY, "AttributeType": "S"},
                      {"AttributeName": LEASE_OWNER, "AttributeType": "S"}]
        description = self.describe(name)
        if description is None:
            self._create(name, {
                "AttributeDefinitions": attributes,
                "KeySchema": [{"AttributeName": LEASE_KEY, "KeyType": "HASH"}],
                "GlobalSecondaryIndexes": [owner_index(self._capacity)],
                **self._capacity.table_params(),
            })
            return
        if _index_status(description) is not None:
            return
        # A KCL 2.x table: add the index, on the table's own billing (KCL copies provisioned capacity).
        self._wait_active(name)
        billing = description.get("BillingModeSummary", {}).get("BillingMode", "PROVISIONED")
        provisioned = description.get("ProvisionedThroughput", {})
        index_capacity = self._capacity if billing == "PAY_PER_REQUEST" else Capacity(
            "PROVISIONED", max(1, int(provisioned.get("ReadCapacityUnits", 0))),
            max(1, int(provisioned.get("WriteCapacityUnits", 0))))
        try:
            request: dict[str, Any] = {"TableName": name, "AttributeDefinitions": attributes,
                                       "GlobalSecondaryIndexUpdates": [{"Create": owner_index(index_capacity)}]}
            call(self._retry, lambda: self._client.update_table(**request), f"UpdateTable {name} add index")
        except StoreError:
            # Another worker may have added it meanwhile; only fail if the index is still missing.
            refreshed = self.describe(name)
            if refreshed is None or _index_status(refreshed) is None:
                raise

    def _wait_active(self, name: str) -> None:
        """Poll until the table and its owner index (if any) are ACTIVE; StoreError after the timeout."""
        clock = self._retry.clock
        deadline = clock.monotonic() + self._timeout
        while True:
            description = self.describe(name)
            status = None if description is None else description.get("TableStatus")
            index = None if description is None else _index_status(description)
            if status == ACTIVE and index in (None, ACTIVE):
                return
            if clock.monotonic() >= deadline:
                raise StoreError(f"table {name} not ACTIVE after {self._timeout:g} s "
                                 f"(table {status}, {LEASE_OWNER_INDEX} {index})")
            clock.sleep(self._poll_interval)


def _index_status(description: dict[str, Any]) -> str | None:
    """The status of the owner index in a table description, None when the table has none."""
    for index in description.get("GlobalSecondaryIndexes", []):
        if index.get("IndexName") == LEASE_OWNER_INDEX:
            return str(index.get("IndexStatus", ACTIVE))
    return None
