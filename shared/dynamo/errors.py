"""Sorts botocore failures into transient (retried) and permanent (StoreError), and surfaces lost conditions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, CredentialRetrievalError, HTTPClientError

from shardherd.shared.dynamo.expressions import Item
from shardherd.shared.errors import StoreError
from shardherd.shared.retry import RetryPolicy

T = TypeVar("T")

TRANSIENT_CODES = frozenset({
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "LimitExceededException",
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionConflictException",
    "TransactionInProgressException",
})
# Per-item reasons of a cancelled transaction that mean "try again", not "the condition failed".
TRANSIENT_CANCELLATION_CODES = frozenset({"TransactionConflict", "ThrottlingError",
                                          "ProvisionedThroughputExceeded", "RequestLimitExceeded"})
CONDITION_FAILED = "ConditionalCheckFailedException"
TRANSACTION_CANCELED = "TransactionCanceledException"


class ConditionFailed(Exception):
    """A conditional write was not applied; `item` is the row as it was (None if DynamoDB did not return it)."""

    def __init__(self, item: Item | None) -> None:
        super().__init__("conditional check failed")
        self.item = item


class TransactionCanceled(Exception):
    """A transaction was cancelled; `reasons` holds one entry per transaction item, in order."""

    def __init__(self, reasons: Sequence[dict[str, Any]]) -> None:
        super().__init__("transaction cancelled: " + ", ".join(str(r.get("Code")) for r in reasons))
        self.reasons = list(reasons)


def error_code(exc: ClientError) -> str:
    """The service's error code (`ProvisionedThroughputExceededException`, ...)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def cancellation_reasons(exc: ClientError) -> list[dict[str, Any]]:
    """The per-item reasons of a TransactionCanceledException."""
    return list(exc.response.get("CancellationReasons", []))  # type: ignore[arg-type]


def is_transient(exc: BaseException) -> bool:
    """True for throttling, 5xx, dropped connections, timeouts, transaction conflicts and credentials not refreshed.

    Credentials that cannot be fetched (the container endpoint, IMDS or STS failing while they are due for refresh)
    are an outage of the credential source, like a store outage: retried, and once the budget is spent a
    StoreUnavailable (agents fence, a leader stands down) rather than a StoreError that ends every process of the
    fleet at once (the fault matrix's "credentials fail to refresh" cell: every agent and replica exited 70 within
    7 s). Credentials the service rejects (AccessDenied, UnrecognizedClientException) stay permanent.
    """
    if isinstance(exc, ConnectionError | HTTPClientError | CredentialRetrievalError):
        return True
    if not isinstance(exc, ClientError):
        return False
    code = error_code(exc)
    if code in TRANSIENT_CODES:
        return True
    if code == TRANSACTION_CANCELED:
        return any(reason.get("Code") in TRANSIENT_CANCELLATION_CODES for reason in cancellation_reasons(exc))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return isinstance(status, int) and status >= 500


def call(retry: RetryPolicy, operation: Callable[[], T], what: str) -> T:
    """Run one DynamoDB call with retries, turning its failures into shardherd's outcomes and errors.

    Lost conditions become ConditionFailed/TransactionCanceled, anything else StoreError (StoreUnavailable when
    transient failures outlast the retry budget).
    """
    try:
        return retry.call(operation, is_transient, what)
    except ClientError as exc:
        code = error_code(exc)
        if code == CONDITION_FAILED:
            raise ConditionFailed(exc.response.get("Item")) from None  # type: ignore[arg-type]
        if code == TRANSACTION_CANCELED:
            raise TransactionCanceled(cancellation_reasons(exc)) from None
        raise StoreError(f"{what}: {code}: {exc.response.get('Error', {}).get('Message', exc)}") from exc
    except BotoCoreError as exc:
        raise StoreError(f"{what}: {exc}") from exc
