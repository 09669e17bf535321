"""Opens the configured store backend from Settings, so processes never construct backends by hand."""

from __future__ import annotations

from shared.aws import make_client
from shared.config import Settings
from shared.retry import RetryPolicy
from shared.store import LeaseStore


def open_store(settings: Settings, retry: RetryPolicy | None = None) -> LeaseStore:
    """The DynamoDB or SQL store named by `settings.store_backend`, on the application's tables."""
    if settings.store_backend == "dynamodb":
        from shared.dynamo.store import DynamoLeaseStore

        client = make_client("dynamodb", settings.region, settings.dynamodb_endpoint_url)
        return DynamoLeaseStore(
            client,
            settings.table_names,
            retry=retry,
            billing_mode=settings.billing_mode,
            read_capacity=settings.initial_lease_table_read_capacity,
            write_capacity=settings.initial_lease_table_write_capacity,
            consistent_reads=settings.consistent_reads,
        )
    from shared.sql.store import SqlLeaseStore

    return SqlLeaseStore(settings.sql_url.get_secret_value(), settings.table_names, retry=retry)
