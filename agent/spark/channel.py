"""The local channel between the agent in the driver and the source's runner process: two small JSON files.

The streaming source runs in a Python process the Spark JVM spawns, sharing no memory with the driver's agent. The
agent publishes a `Snapshot` of its shards (checkpoint, state, probed segments waiting) by atomically replacing
`snapshot.json`; the runner reads it in every `latestOffset` and answers with `ack.json`: the snapshot version it
planned from and its pid (diagnostics and tests: which process plans, and that it saw a given snapshot).
"""

from __future__ import annotations

import enum
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardherd.agent.read_spec import StartPosition
from shardherd.shared.checkpoint import Checkpoint, Sentinel
from shardherd.shared.errors import InvalidCheckpoint, ShardherdError

SNAPSHOT_FILE = "snapshot.json"
ACK_FILE = "ack.json"


class ChannelError(ShardherdError):
    """A channel file exists but cannot be read as what it should hold."""


class ShardState(enum.Enum):
    """How the driver holds a shard: planned normally, or being handed off (finish in-flight work, plan no more)."""

    OWNED = "owned"
    HANDING_OFF = "handing_off"


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of records the driver's probe saw after a shard's checkpoint: its last record and what it holds.

    `end` is the last Kinesis record with the sub-sequence of its last user record (so a checkpoint there covers
    the whole record); `records` counts Kinesis records, `bytes` their data; arrivals are epoch seconds.
    """

    end: Checkpoint
    records: int
    bytes: int
    first_arrival: float | None = None

    def to_json(self) -> list[Any]:
        """Compact JSON form."""
        return [self.end.sequence_number, self.end.sub_sequence_number, self.records, self.bytes, self.first_arrival]

    @classmethod
    def from_json(cls, value: list[Any]) -> Segment:
        """Parse the compact form (ValueError/TypeError/IndexError on bad input)."""
        return cls(Checkpoint(str(value[0]), int(value[1])), int(value[2]), int(value[3]),
                   None if value[4] is None else float(value[4]))


@dataclass(frozen=True, slots=True)
class ShardView:
    """One held shard as the runner sees it: where it resumes and the probed segments waiting after that.

    `behind_millis` is the probe's MillisBehindLatest at its frontier (None before the first probe); `tenure`
    names this hold of the lease (a new one each time the driver acquires it).
    """

    checkpoint: Checkpoint
    state: ShardState = ShardState.OWNED
    segments: tuple[Segment, ...] = ()
    timestamp: float | None = None
    behind_millis: int | None = None
    tenure: str = ""

    @property
    def pending(self) -> bool:
        """True if records are known to wait after the checkpoint."""
        return bool(self.segments)

    @property
    def unprobed(self) -> bool:
        """True for an owned shard the agent has not probed yet (just acquired): whether records wait is unknown."""
        return self.state is ShardState.OWNED and self.behind_millis is None and not self.segments

    @property
    def next_arrival(self) -> float | None:
        """Arrival time (epoch s) of the first waiting record, when known."""
        return self.segments[0].first_arrival if self.segments else None

    @property
    def position(self) -> StartPosition:
        """Where a read of this shard starts (AT_TIMESTAMP leases start at the application's timestamp)."""
        if self.checkpoint.sentinel is Sentinel.AT_TIMESTAMP and self.timestamp is not None:
            return StartPosition.at_timestamp(self.timestamp)
        return StartPosition.after(self.checkpoint)

    @property
    def frontier(self) -> StartPosition:
        """Where the next probe starts: after the last probed segment, else at the checkpoint."""
        if self.segments:
            return StartPosition.after(self.segments[-1].end, record_complete=True)
        return self.position

    def to_json(self) -> dict[str, Any]:
        """JSON form for the snapshot file."""
        return {"cp": self.checkpoint.sequence_number, "sub": self.checkpoint.sub_sequence_number,
                "state": self.state.value, "segments": [segment.to_json() for segment in self.segments],
                "ts": self.timestamp, "behind": self.behind_millis, "tenure": self.tenure}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ShardView:
        """Parse the JSON form (KeyError/ValueError on bad input; `read_snapshot` turns them into ChannelError)."""
        behind = value.get("behind")
        return cls(Checkpoint(value["cp"], int(value.get("sub", 0))), ShardState(value["state"]),
                   tuple(Segment.from_json(item) for item in value.get("segments", [])), value.get("ts"),
                   None if behind is None else int(behind), str(value.get("tenure", "")))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The agent's shards at one moment, numbered so the runner can acknowledge what it planned from.

    `incoming` names the leases handed to this driver whose previous owner is still finishing (lease keys): they
    become shards of a later snapshot once released to it, and a plan may wait a moment for them.
    """

    version: int
    worker_id: str
    shards: dict[str, ShardView] = field(default_factory=dict)
    incoming: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        """JSON form for the snapshot file."""
        return {"version": self.version, "worker": self.worker_id,
                "shards": {shard: view.to_json() for shard, view in sorted(self.shards.items())},
                "incoming": sorted(self.incoming)}


@dataclass(frozen=True, slots=True)
class Ack:
    """The runner's answer: the snapshot version its last plan used, and its pid (diagnostics and tests)."""

    version: int
    pid: int


def _write_atomic(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(payload, out)
    os.replace(temporary, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ChannelError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ChannelError(f"{path} must hold a JSON object")
    return value


def write_snapshot(directory: Path, snapshot: Snapshot) -> None:
    """Publish a snapshot (atomic replace: readers see the old or the new one, never a mix)."""
    _write_atomic(directory / SNAPSHOT_FILE, snapshot.to_json())


def read_snapshot(directory: Path) -> Snapshot | None:
    """The last published snapshot, or None if the agent has not published one yet."""
    value = _read(directory / SNAPSHOT_FILE)
    if value is None:
        return None
    try:
        shards = {str(shard): ShardView.from_json(view) for shard, view in value["shards"].items()}
        return Snapshot(int(value["version"]), str(value["worker"]), shards,
                        frozenset(str(key) for key in value.get("incoming", [])))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, InvalidCheckpoint) as exc:
        raise ChannelError(f"{directory / SNAPSHOT_FILE} is malformed: {exc}") from exc


def write_ack(directory: Path, ack: Ack) -> None:
    """Record which snapshot version the runner planned from."""
    _write_atomic(directory / ACK_FILE, {"version": ack.version, "pid": ack.pid})


def read_ack(directory: Path) -> Ack | None:
    """The runner's last ack, or None before its first plan."""
    value = _read(directory / ACK_FILE)
    if value is None:
        return None
    try:
        return Ack(int(value["version"]), int(value["pid"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ChannelError(f"{directory / ACK_FILE} is malformed: {exc}") from exc
