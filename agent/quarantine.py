"""Dead-letter destinations for poison records (docs/decisions/0031-operator-controls.md, "Poison records").

Under `poison_policy = quarantine` a record the processor keeps failing is written here before the shard checkpoints
past it; `shardherd dlq list|replay` read it back. Invariants:

- A destination is named by a URL: `file:///absolute/dir` or `s3://bucket[/prefix]`; anything else is a
  BadDestination (a ConfigError: one line, nothing written). `open_destination(..., check=True)` also proves the
  destination exists and takes writes (a probe object written and removed), so an agent refuses to start without one.
- One record is one object named by stream, shard, sequence and sub-sequence: the same record written twice is the
  same object (idempotent), so a retry after a failed write, a crash or a takeover never makes a second copy.
- `put` either leaves the whole object in place or raises (a file is written to a temporary name and renamed; an S3
  object appears whole). The shard worker checkpoints past a record only after `put` returned.
- A file destination never creates its root directory: a root that is gone makes every write fail (the shard blocks)
  instead of quietly recreating an empty directory elsewhere in the operator's view.
- Every S3 call has a deadline (the client's connect and read timeouts, no botocore retries).
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from shardherd.agent.records import Record
from shardherd.shared.aws import make_client
from shardherd.shared.dlq_url import BadDestination, parse_destination
from shardherd.shared.errors import ShardherdError

# Connect and read timeouts (seconds) of one S3 call: a blackholed endpoint fails the write (the shard stays blocked
# and retries) instead of hanging the shard's thread.
S3_TIMEOUTS = (2.0, 10.0)
PROBE_NAME = ".shardherd-probe"
SUFFIX = ".json"


class DestinationError(ShardherdError):
    """A read, write or removal at a destination failed (the caller retries; nothing is skipped)."""


@dataclass(frozen=True, slots=True)
class Quarantined:
    """One poison record as stored: everything needed to inspect it and to put it back into a stream."""

    stream: str
    shard_id: str
    sequence_number: str
    sub_sequence_number: int
    partition_key: str
    explicit_hash_key: str | None
    data: str  # base64
    approximate_arrival: str | None  # ISO 8601
    error: str
    attempts: int
    worker_id: str
    quarantined_at: str  # ISO 8601

    @classmethod
    def of(cls, record: Record, stream: str, error: str, attempts: int, worker_id: str,
           when: datetime) -> Quarantined:
        """The stored form of `record`, read from `stream`, that failed `attempts` times with `error`."""
        arrival = record.approximate_arrival_timestamp
        return cls(stream, record.shard_id, record.sequence_number, record.sub_sequence_number, record.partition_key,
                   record.explicit_hash_key, base64.b64encode(record.data).decode("ascii"),
                   None if arrival is None else arrival.isoformat(), error, attempts, worker_id, when.isoformat())

    @property
    def name(self) -> str:
        """The object's name under the destination: one per (stream, shard, sequence, sub-sequence)."""
        return f"{self.stream}/{self.shard_id}/{self.sequence_number}-{self.sub_sequence_number:05d}{SUFFIX}"

    @property
    def payload(self) -> bytes:
        """The record's data."""
        return base64.b64decode(self.data)

    def to_json(self) -> bytes:
        """The stored bytes."""
        return json.dumps(asdict(self), sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, body: bytes, name: str) -> Quarantined:
        """Read a stored record; DestinationError naming `name` when it is not one."""
        try:
            fields: dict[str, Any] = json.loads(body)
            return cls(**fields)
        except (ValueError, TypeError) as exc:
            raise DestinationError(f"{name} is not a quarantined record: {exc}") from exc


class Destination(Protocol):
    """Where quarantined records are kept."""

    url: str

    def put(self, record: Quarantined) -> None:
        """Store `record` (replacing an earlier copy of the same record); raises when it is not stored."""

    def names(self) -> Iterator[str]:
        """The names of the stored records, sorted."""

    def get(self, name: str) -> Quarantined:
        """The stored record called `name`."""

    def remove(self, name: str) -> None:
        """Delete the stored record called `name` (gone already: nothing to do)."""


class FileDestination:
    """A directory: one JSON file per record under `<stream>/<shard>/`, written to a temporary name and renamed."""

    def __init__(self, url: str, root: Path) -> None:
        self.url = url
        self.root = root

    def check(self) -> None:
        """BadDestination unless the directory exists and takes a file."""
        if not self.root.is_dir():
            raise BadDestination(f"poison_destination {self.url}: {self.root} is not an existing directory")
        try:
            self._write(self.root / PROBE_NAME, b"probe")
            (self.root / PROBE_NAME).unlink()
        except OSError as exc:
            raise BadDestination(f"poison_destination {self.url}: cannot write in {self.root}: {exc}") from exc

    def put(self, record: Quarantined) -> None:
        """Write the record's file atomically (its stream and shard directories made under the existing root)."""
        target = self.root / record.name
        try:
            for directory in (target.parent.parent, target.parent):  # never the root itself
                directory.mkdir(exist_ok=True)
            self._write(target, record.to_json())
        except OSError as exc:
            raise DestinationError(f"writing {target}: {exc}") from exc

    @staticmethod
    def _write(target: Path, body: bytes) -> None:
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(body)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def names(self) -> Iterator[str]:
        """Every record file's path relative to the root (temporary files excluded)."""
        if not self.root.is_dir():
            raise DestinationError(f"{self.url}: {self.root} is not an existing directory")
        for path in sorted(self.root.glob(f"*/*/*{SUFFIX}")):
            if not path.name.startswith("."):
                yield path.relative_to(self.root).as_posix()

    def get(self, name: str) -> Quarantined:
        """Read one record file."""
        try:
            return Quarantined.from_json((self.root / name).read_bytes(), name)
        except OSError as exc:
            raise DestinationError(f"reading {self.root / name}: {exc}") from exc

    def remove(self, name: str) -> None:
        """Delete one record file."""
        try:
            (self.root / name).unlink(missing_ok=True)
        except OSError as exc:
            raise DestinationError(f"removing {self.root / name}: {exc}") from exc


class S3Destination:
    """An S3 bucket and key prefix: one JSON object per record under `<prefix>/<stream>/<shard>/`."""

    def __init__(self, url: str, bucket: str, prefix: str, client: Any) -> None:
        self.url = url
        self.bucket = bucket
        self.prefix = prefix
        self._s3 = client

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def check(self) -> None:
        """BadDestination unless the bucket exists and takes an object under the prefix."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._s3.put_object(Bucket=self.bucket, Key=self._key(PROBE_NAME), Body=b"probe")
            self._s3.delete_object(Bucket=self.bucket, Key=self._key(PROBE_NAME))
        except (BotoCoreError, ClientError) as exc:
            raise BadDestination(f"poison_destination {self.url}: cannot write to bucket {self.bucket}: "
                                 f"{exc}") from exc

    def _call(self, what: str, name: str, call: Any, **params: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return call(Bucket=self.bucket, **params)
        except (BotoCoreError, ClientError) as exc:
            raise DestinationError(f"{what} s3://{self.bucket}/{self._key(name)}: {exc}") from exc

    def put(self, record: Quarantined) -> None:
        """PutObject the record (the same key for the same record)."""
        self._call("writing", record.name, self._s3.put_object, Key=self._key(record.name), Body=record.to_json(),
                   ContentType="application/json")

    def names(self) -> Iterator[str]:
        """Every record object's name relative to the prefix."""
        start = self._key("")
        token: dict[str, str] = {}
        while True:
            page = self._call("listing", "", self._s3.list_objects_v2, Prefix=start, **token)
            for item in page.get("Contents", []):
                name = item["Key"][len(start):]
                if name.endswith(SUFFIX) and not name.rsplit("/", 1)[-1].startswith("."):
                    yield name
            if not page.get("IsTruncated"):
                return
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def get(self, name: str) -> Quarantined:
        """GetObject one record."""
        body: bytes = self._call("reading", name, self._s3.get_object, Key=self._key(name))["Body"].read()
        return Quarantined.from_json(body, name)

    def remove(self, name: str) -> None:
        """DeleteObject one record."""
        self._call("removing", name, self._s3.delete_object, Key=self._key(name))


def open_destination(url: str, region: str, s3_endpoint_url: str | None = None,
                     check: bool = False) -> FileDestination | S3Destination:
    """The destination `url` names; with `check`, BadDestination unless it exists and takes writes."""
    scheme, where, prefix = parse_destination(url)
    destination: FileDestination | S3Destination
    if scheme == "file":
        destination = FileDestination(url, Path(where))
    else:
        destination = S3Destination(url, where, prefix, make_client("s3", region, s3_endpoint_url, S3_TIMEOUTS))
    if check:
        destination.check()
    return destination
