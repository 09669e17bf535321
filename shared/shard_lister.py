"""Reads a stream's full shard list with ListShards: AWS-style pagination, retries, de-duplication.

The request never uses ShardFilter (emulators ignore it, and shard sync needs the whole lineage anyway). MaxResults is
sent only when a page size is asked for; services that ignore it return everything at once, which works the same.
Follow-up pages send NextToken without StreamName, as AWS requires.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from shardherd.shared.dynamo.errors import error_code, is_transient
from shardherd.shared.errors import ShardherdError
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.shards import Shard, ShardListError

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient
    from mypy_boto3_kinesis.type_defs import ListShardsOutputTypeDef

_EXPIRED_TOKEN = "ExpiredNextTokenException"


class ShardListingError(ShardherdError):
    """ListShards failed for a non-transient reason (bad request, access denied, token expired too often)."""


class StreamNotFound(ShardListingError, LookupError):
    """The stream does not exist (or is not visible with these credentials)."""


def list_shards(
    kinesis_client: KinesisClient,
    stream_name: str,
    retry: RetryPolicy,
    page_size: int | None = None,
    max_restarts: int = 3,
) -> list[Shard]:
    """Every shard of `stream_name` (open and closed), each once, in the order the service listed them.

    Throttling, 5xx and connection errors are retried with `retry` (StoreUnavailable once its budget is spent). An
    expired NextToken restarts the listing from the first page, at most `max_restarts` times.
    """
    if page_size is not None and not 1 <= page_size <= 10_000:
        raise ValueError(f"page_size must be between 1 and 10000, got {page_size}")
    for _ in range(max_restarts + 1):
        try:
            return _list_all_pages(kinesis_client, stream_name, retry, page_size)
        except ClientError as exc:
            if error_code(exc) != _EXPIRED_TOKEN:
                raise _typed(exc, stream_name) from exc
    raise ShardListingError(f"ListShards for {stream_name}: NextToken expired {max_restarts + 1} times in a row")


def _list_all_pages(
    client: KinesisClient, stream_name: str, retry: RetryPolicy, page_size: int | None
) -> list[Shard]:
    shards: dict[str, Shard] = {}
    request: dict[str, Any] = {"StreamName": stream_name}
    tokens_seen: set[str] = set()
    while True:
        if page_size is not None:
            request["MaxResults"] = page_size
        page = _call(client, request, retry, stream_name)
        for item in page.get("Shards", []):
            _add(shards, Shard.from_list_shards_item(item))
        token = page.get("NextToken")
        if not token:
            return list(shards.values())
        if token in tokens_seen:
            raise ShardListError(f"ListShards for {stream_name} returned the same NextToken twice")
        tokens_seen.add(token)
        request = {"NextToken": token}


def _call(
    client: KinesisClient, request: dict[str, Any], retry: RetryPolicy, stream_name: str
) -> ListShardsOutputTypeDef:
    return retry.call(lambda: client.list_shards(**request), is_transient, f"ListShards for {stream_name}")


def _add(shards: dict[str, Shard], shard: Shard) -> None:
    """Keep one entry per shard id; a shard seen open on one page and closed on a later one is kept closed."""
    known = shards.get(shard.shard_id)
    if known is None or known == shard:
        shards.setdefault(shard.shard_id, shard)
        return
    same_identity = (known.parent_ids, known.hash_range, known.starting_sequence_number) == (
        shard.parent_ids,
        shard.hash_range,
        shard.starting_sequence_number,
    )
    if not same_identity or (not known.is_open and not shard.is_open):
        raise ShardListError(f"shard {shard.shard_id} was listed twice with different descriptions")
    if known.is_open:
        shards[shard.shard_id] = shard


def _typed(exc: ClientError, stream_name: str) -> ShardListingError:
    code = error_code(exc)
    message = exc.response.get("Error", {}).get("Message", "")
    if code == "ResourceNotFoundException":
        return StreamNotFound(f"stream {stream_name} not found: {message}")
    return ShardListingError(f"ListShards for {stream_name} failed: {code}: {message}")
