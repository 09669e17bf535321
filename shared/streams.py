"""Stream identifiers and the lease keys of multi-stream applications, in KCL 3.x's exact text format.

A single-stream application keys a lease by the shard id (`shardId-000000000042`). A multi-stream application
keys it `account:streamName:creationEpoch:shardId` and also stores `streamName` (the serialized identifier
`account:streamName:creationEpoch`, despite its name) and `shardId`. `parse_lease_key` reads both forms; a key that
looks multi-stream but does not parse, or whose attributes disagree with it, raises MalformedLeaseKey: the row is
reported and left in the table, never dropped or rewritten.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardherd.shared.errors import ShardherdError
from shardherd.shared.lease import Lease

DELIMITER = ":"
# Kinesis' own rules: stream names are 1-128 of [a-zA-Z0-9_.-], shard ids the same characters. KCL accepts any
# run of digits as the account (an ARN's account id has 12) and whole seconds since 1970 as the creation epoch.
STREAM_NAME_PATTERN = r"[A-Za-z0-9_.\-]{1,128}"
ACCOUNT_PATTERN = r"[0-9]{1,20}"
_STREAM_NAME = re.compile(STREAM_NAME_PATTERN)
_SHARD_ID = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
_ACCOUNT = re.compile(ACCOUNT_PATTERN)
_EPOCH = re.compile(r"[0-9]{1,19}")


class MalformedLeaseKey(ShardherdError, ValueError):
    """A lease key (with its `streamName`/`shardId` attributes) is neither a shard id nor a valid multi-stream key."""

    def __init__(self, lease_key: str, reason: str) -> None:
        super().__init__(f"lease key {lease_key!r}: {reason}")
        self.lease_key = lease_key
        self.reason = reason


class LeaseOutOfScope(ShardherdError, ValueError):
    """A lease belongs to a stream (or key format) this application does not read; it is left alone or refused."""


@dataclass(frozen=True, slots=True, order=True)
class StreamIdentifier:
    """One stream of a multi-stream application: account, name and creation time (a recreated stream is another)."""

    account_id: str
    name: str
    creation_epoch: int

    def __post_init__(self) -> None:
        if not _ACCOUNT.fullmatch(self.account_id):
            raise ValueError(f"account id {self.account_id!r} must be digits")
        if not _STREAM_NAME.fullmatch(self.name):
            raise ValueError(f"stream name {self.name!r} must be 1-128 characters of [A-Za-z0-9_.-]")
        if self.creation_epoch < 0:
            raise ValueError(f"creation epoch {self.creation_epoch} must be >= 0")

    @property
    def serialized(self) -> str:
        """`account:streamName:creationEpoch`, what KCL stores in a multi-stream lease's `streamName` attribute."""
        return DELIMITER.join((self.account_id, self.name, str(self.creation_epoch)))

    def lease_key(self, shard_id: str) -> str:
        """The multi-stream lease key of one of this stream's shards."""
        return f"{self.serialized}{DELIMITER}{shard_id}"

    @classmethod
    def parse(cls, text: str) -> StreamIdentifier:
        """Read a serialized identifier; ValueError naming the part that is wrong."""
        parts = text.split(DELIMITER)
        if len(parts) != 3:
            raise ValueError(f"{text!r} is not account:streamName:creationEpoch")
        account, name, epoch = parts
        if not _EPOCH.fullmatch(epoch):
            raise ValueError(f"creation epoch {epoch!r} is not a whole number of seconds")
        return cls(account, name, int(epoch))


@dataclass(frozen=True, slots=True)
class LeaseAddress:
    """Where a lease's shard lives: its stream (None for a single-stream application's lease) and shard id."""

    stream: StreamIdentifier | None
    shard_id: str


def parse_lease_key(lease_key: str, stream_attribute: str | None = None,
                    shard_attribute: str | None = None) -> LeaseAddress:
    """The stream and shard a lease row names; MalformedLeaseKey if key and attributes do not agree on one.

    A key without `:` and without the multi-stream attributes is a single-stream lease. Anything else must be a
    well-formed `account:streamName:creationEpoch:shardId` whose `streamName` / `shardId` attributes, when
    present, repeat the key's parts (KCL writes both on every multi-stream lease).
    """
    if DELIMITER not in lease_key and stream_attribute is None and shard_attribute is None:
        if not _SHARD_ID.fullmatch(lease_key):
            raise MalformedLeaseKey(lease_key, "is not a shard id (1-128 characters of [A-Za-z0-9_.-])")
        return LeaseAddress(None, lease_key)
    prefix, _, shard_id = lease_key.rpartition(DELIMITER)
    if not prefix:
        raise MalformedLeaseKey(lease_key, "has streamName/shardId attributes but is not account:stream:epoch:shard")
    try:
        stream = StreamIdentifier.parse(prefix)
    except ValueError as exc:
        raise MalformedLeaseKey(lease_key, f"not account:streamName:creationEpoch:shardId ({exc})") from None
    if not _SHARD_ID.fullmatch(shard_id):
        raise MalformedLeaseKey(lease_key, f"shard id {shard_id!r} is not 1-128 characters of [A-Za-z0-9_.-]")
    if stream_attribute is not None and stream_attribute != prefix:
        raise MalformedLeaseKey(lease_key, f"streamName attribute {stream_attribute!r} differs from the key's stream")
    if shard_attribute is not None and shard_attribute != shard_id:
        raise MalformedLeaseKey(lease_key, f"shardId attribute {shard_attribute!r} differs from the key's shard")
    return LeaseAddress(stream, shard_id)


def stream_prefix(lease_key: str) -> str | None:
    """The `account:stream:epoch` part of a multi-stream lease key (None for a key without one); no validation."""
    prefix, _, _ = lease_key.rpartition(DELIMITER)
    return prefix or None


def lease_address(lease: Lease) -> LeaseAddress:
    """`parse_lease_key` for a decoded lease."""
    return parse_lease_key(lease.lease_key, lease.stream_name, lease.shard_id)


def stream_name_of(lease: Lease) -> str | None:
    """The Kinesis stream name a multi-stream lease names (None for single-stream and malformed keys)."""
    try:
        stream = lease_address(lease).stream
    except MalformedLeaseKey:
        return None
    return None if stream is None else stream.name


def stream_to_read(lease: Lease, single_stream: str | None, streams: frozenset[str]) -> str:
    """The Kinesis stream an agent reads `lease` from; LeaseOutOfScope (or MalformedLeaseKey) if it must not.

    `single_stream` is a single-stream application's stream (None in a multi-stream one, whose stream names are
    `streams`). A KCL leader in a mixed fleet may hand an agent such a lease: it is refused (given back), never read
    from the wrong stream.
    """
    stream = lease_address(lease).stream
    if single_stream is not None:
        if stream is not None:
            raise LeaseOutOfScope(f"{lease.lease_key} is a multi-stream lease; this agent reads one stream")
        return single_stream
    if stream is None:
        raise LeaseOutOfScope(f"{lease.lease_key} is a single-stream lease; this agent reads several streams")
    if stream.name not in streams:
        raise LeaseOutOfScope(f"{lease.lease_key}: stream {stream.name} is not one of this agent's streams")
    return stream.name


def read_target(source_key: str, default_stream: str) -> tuple[str, str]:
    """(stream name, shard id) of a Spark source key: a multi-stream lease key, or a shard of `default_stream`."""
    try:
        address = parse_lease_key(source_key)
    except MalformedLeaseKey:
        return default_stream, source_key
    return (default_stream if address.stream is None else address.stream.name), address.shard_id
