"""The multi-stream shard source: identifies each configured stream (KCL's `account:name:creationEpoch`) and lists it.

An identifier part the configuration leaves out is read once with DescribeStreamSummary: the account from the
stream's ARN, the creation epoch from its creation timestamp (whole seconds), as KCL derives them for a stream
given by ARN. A stream that cannot be identified or listed is reported in the listings' errors; the other streams
sync on.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from shardherd.coordinator.stream_sync import StreamListings
from shardherd.shared.config import StreamSpec
from shardherd.shared.dynamo.errors import is_transient
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.shard_lister import list_shards
from shardherd.shared.shards import Shard
from shardherd.shared.streams import StreamIdentifier

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient

log = logging.getLogger(__name__)


class MultiStreamSource:
    """Callable shard source of a multi-stream application (see the module docstring); thread-safe."""

    def __init__(self, client: KinesisClient, specs: tuple[StreamSpec, ...], retry: RetryPolicy) -> None:
        self._client = client
        self._specs = specs
        self._retry = retry
        self._identified: dict[str, StreamIdentifier] = {}
        self._guard = threading.Lock()

    def identify(self, spec: StreamSpec) -> StreamIdentifier:
        """The stream's identifier: the configured parts, the rest from DescribeStreamSummary (cached once known)."""
        with self._guard:
            known = self._identified.get(spec.name)
        if known is not None:
            return known
        account, epoch = spec.account_id, spec.creation_epoch
        if account is None or epoch is None:
            described = self._retry.call(lambda: self._client.describe_stream_summary(StreamName=spec.name),
                                         is_transient, f"DescribeStreamSummary for {spec.name}")
            summary = described["StreamDescriptionSummary"]
            # arn:aws:kinesis:<region>:<account>:stream/<name>
            account = account if account is not None else summary["StreamARN"].split(":")[4]
            epoch = epoch if epoch is not None else int(summary["StreamCreationTimestamp"].timestamp())
        identifier = StreamIdentifier(account, spec.name, epoch)
        with self._guard:
            self._identified[spec.name] = identifier
        log.info("stream %s is %s", spec.name, identifier.serialized)
        return identifier

    def __call__(self) -> StreamListings:
        """Identify and list every configured stream; failures are per stream."""
        streams: set[StreamIdentifier] = set()
        shards: dict[StreamIdentifier | None, list[Shard]] = {}
        errors: dict[str, str] = {}
        for spec in self._specs:
            try:
                identifier = self.identify(spec)
            except Exception as exc:
                errors[spec.name] = f"{type(exc).__name__}: {exc}"
                continue
            streams.add(identifier)
            try:
                shards[identifier] = list_shards(self._client, spec.name, self._retry)
            except Exception as exc:
                errors[identifier.serialized] = f"{type(exc).__name__}: {exc}"
        return StreamListings(frozenset(streams), shards, errors)
