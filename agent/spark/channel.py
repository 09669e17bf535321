"""The local channel between the agent in the driver and the source's runner process: two small JSON files.

The streaming source runs in a Python process the Spark JVM spawns, sharing no memory with the driver's agent. The
agent publishes a `Snapshot` of its shards (checkpoint, state, whether records wait, an iterator) by atomically
replacing `snapshot.json`; the runner reads it in every `latestOffset` and answers with `ack.json`: the snapshot
version it planned from and its pid (diagnostics and tests: which process plans, and that it saw a given snapshot).
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
class ShardView:
    """One held shard as the runner sees it: where it resumes, and whether records are known to wait after that.

    `pending` says records wait (a probe saw one, or the last batch read some or stopped behind the tip);
    `waiting_since` is the arrival (epoch s) of the first waiting record when a probe saw it. `behind_millis` is
    Kinesis' MillisBehindLatest at the last probe or read (None before the first). `iterator` is a shard iterator at
    the resume position, when the driver has one. `tenure` names this hold of the lease (new at each acquisition).
    """

    checkpoint: Checkpoint
    state: ShardState = ShardState.OWNED
    pending: bool = False
    timestamp: float | None = None
    behind_millis: int | None = None
    tenure: str = ""
    iterator: str | None = None
    waiting_since: float | None = None

    @property
    def unprobed(self) -> bool:
        """True for an owned shard the agent has not probed yet (just acquired): whether records wait is unknown."""
        return self.state is ShardState.OWNED and self.behind_millis is None and not self.pending

    @property
    def position(self) -> StartPosition:
        """Where a read of this shard starts (AT_TIMESTAMP leases start at the application's timestamp)."""
        if self.checkpoint.sentinel is Sentinel.AT_TIMESTAMP and self.timestamp is not None:
            return StartPosition.at_timestamp(self.timestamp)
        return StartPosition.after(self.checkpoint)

    def to_json(self) -> dict[str, Any]:
        """JSON form for the snapshot file."""
        return {"cp": self.checkpoint.sequence_number, "sub": self.checkpoint.sub_sequence_number,
                "state": self.state.value, "pending": self.pending, "ts": self.timestamp,
                "behind": self.behind_millis, "tenure": self.tenure, "it": self.iterator,
                "since": self.waiting_since}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ShardView:
        """Parse the JSON form (KeyError/ValueError on bad input; `read_snapshot` turns them into ChannelError)."""
        behind, iterator, since = value.get("behind"), value.get("it"), value.get("since")
        return cls(Checkpoint(value["cp"], int(value.get("sub", 0))), ShardState(value["state"]),
                   bool(value.get("pending", False)), value.get("ts"), None if behind is None else int(behind),
                   str(value.get("tenure", "")), None if iterator is None else str(iterator),
                   None if since is None else float(since))


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
