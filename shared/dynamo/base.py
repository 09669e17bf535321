"""The request plumbing shared by the DynamoDB store's parts: retried calls, reads, paginated scans."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from shardherd.shared.dynamo.errors import ConditionFailed, call
from shardherd.shared.dynamo.expressions import Item
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.store import TableNames

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient


class DynamoAccess:
    """A low-level DynamoDB client, the application's table names and the retry policy every request goes through."""

    def __init__(self, client: DynamoDBClient, tables: TableNames, retry: RetryPolicy | None,
                 consistent_reads: bool) -> None:
        self.tables = tables
        self._client = client
        self._retry = retry or RetryPolicy()
        self._consistent_reads = consistent_reads

    def _call(self, operation: Callable[[], Any], what: str, attempts: list[int] | None = None) -> Any:
        """One request through the retry policy; `attempts` (if given) collects how often it was sent."""
        if attempts is None:
            return call(self._retry, operation, what)

        def counted() -> Any:
            attempts.append(1)
            return operation()

        return call(self._retry, counted, what)

    def _get(self, table: str, key: Mapping[str, Any], consistent: bool, what: str) -> Item | None:
        response = self._call(lambda: self._client.get_item(TableName=table, Key=key, ConsistentRead=consistent),
                              what)
        item: Item | None = response.get("Item")
        return item

    def _scan(self, table: str, page_size: int, what: str) -> Iterator[Item]:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        params: dict[str, Any] = {"TableName": table, "Limit": page_size, "ConsistentRead": self._consistent_reads}
        while True:
            response = self._call(lambda: self._client.scan(**params), what)
            yield from response.get("Items", [])
            last = response.get("LastEvaluatedKey")
            if not last:
                return
            params["ExclusiveStartKey"] = last

    def _conditional(self, operation: Callable[[], Any], what: str) -> bool:
        """True if a conditional request was applied, False if its condition failed."""
        try:
            self._call(operation, what)
        except ConditionFailed:
            return False
        return True

