"""Typed errors shared by every shardherd package, so callers can tell bad input from a broken store."""

from __future__ import annotations


class ShardherdError(Exception):
    """Base class of every error shardherd raises on purpose."""


class InvalidCheckpoint(ShardherdError, ValueError):
    """A checkpoint value is neither a known sentinel nor a decimal sequence number (with a valid sub-sequence)."""


class MalformedRow(ShardherdError):
    """A stored row cannot be read; it is reported with its key (None if unreadable) and left untouched."""

    def __init__(self, what: str, key: str | None, reason: str) -> None:
        super().__init__(f"malformed {what} {key!r}: {reason}")
        self.key = key
        self.reason = reason


class MalformedLease(MalformedRow):
    """A stored lease row cannot be read; it is reported with its key and left untouched in the store."""

    def __init__(self, lease_key: str | None, reason: str) -> None:
        super().__init__("lease", lease_key, reason)
        self.lease_key = lease_key


class MalformedWorker(MalformedRow):
    """A stored worker record cannot be read; it is reported with its id and left untouched in the store."""

    def __init__(self, worker_id: str | None, reason: str) -> None:
        super().__init__("worker record", worker_id, reason)
        self.worker_id = worker_id


class StoreUnavailable(ShardherdError):
    """The store kept failing with transient errors (throttling, 5xx, connection loss) past the retry budget."""


class StoreError(ShardherdError):
    """The store rejected a request for a non-transient reason (missing table, bad credentials, bad request)."""


class ConfigError(ShardherdError, ValueError):
    """Configuration values are missing or out of range; the message names every offending setting."""
