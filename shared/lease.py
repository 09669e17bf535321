"""The lease: one row per shard saying who reads it and how far it got, with KCL 3.x attribute semantics."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from shardherd.shared.checkpoint import TRIM_HORIZON, Checkpoint
from shardherd.shared.row_checks import InvalidRowValue, count_problem, throughput_problem


@dataclass(frozen=True, slots=True)
class Lease:
    """An immutable snapshot of one lease row.

    Field names map one to one to KCL's stored attributes (`leaseKey`, `leaseOwner`, ...; see
    `shardherd.shared.dynamo.lease_codec`).
    During a graceful handoff `lease_owner` is the *next* owner and `checkpoint_owner` the one still processing.
    `millis_behind_latest`, `records_processed`, `bytes_processed` and `records_behind` are the processing worker's
    progress as of its last checkpoint (shardherd's attributes; the checkpoint write carries them, so they cost no
    extra write and keep the worker's heartbeat row small).
    `last_move` is the leader's record of the move that gave the lease its owner (shardherd's attribute, opaque
    here: services/leader_status.py writes and reads it), stored by the very write that moved it, so no move's record
    is lost with a leader killed before it published its status.
    `paused` is the operator's pause (its reason; None while the shard runs) and `paused_by` the worker that
    acknowledged it by stopping (shared/pause.py; shardherd's attributes, which KCL ignores and keeps).
    `repairs` says what a decoder had to drop from the stored row (see shared/row_checks.py); it is never stored.
    Construction enforces what every consumer assumes: a non-empty key, a throughput that is None or a plausible
    finite number >= 0 (InvalidRowValue otherwise).
    """

    lease_key: str
    lease_owner: str | None = None
    lease_counter: int = 0
    checkpoint: Checkpoint = TRIM_HORIZON
    owner_switches_since_checkpoint: int = 0
    pending_checkpoint: Checkpoint | None = None
    pending_checkpoint_state: bytes | None = None
    parent_shard_ids: frozenset[str] = field(default_factory=frozenset)
    child_shard_ids: frozenset[str] = field(default_factory=frozenset)
    starting_hash_key: str | None = None
    ending_hash_key: str | None = None
    throughput_kbps: float | None = None
    checkpoint_owner: str | None = None
    stream_name: str | None = None
    shard_id: str | None = None
    millis_behind_latest: int | None = None
    records_processed: int | None = None
    bytes_processed: int | None = None
    records_behind: int | None = None
    checkpointed_at_millis: int | None = None  # the owner's wall clock when it wrote the checkpoint (epoch ms)
    last_move: str | None = None
    paused: str | None = None
    paused_by: str | None = None
    repairs: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not self.lease_key:
            raise InvalidRowValue("a lease needs a non-empty key")
        if self.throughput_kbps is not None and (problem := throughput_problem(self.throughput_kbps)) is not None:
            raise InvalidRowValue(f"lease {self.lease_key!r}: throughput {problem}")
        for figure in (self.millis_behind_latest, self.records_processed, self.bytes_processed, self.records_behind):
            if (problem := count_problem(figure, allow_none=True)) is not None:
                raise InvalidRowValue(f"lease {self.lease_key!r}: progress {problem}")

    @property
    def actual_owner(self) -> str | None:
        """The worker really processing the shard: the checkpoint owner during a handoff, else the lease owner."""
        return self.checkpoint_owner if self.checkpoint_owner is not None else self.lease_owner

    @property
    def shard(self) -> str:
        """The shard id: stored explicitly for multi-stream leases, else the lease key itself."""
        if self.shard_id is not None:
            return self.shard_id
        return self.lease_key.rsplit(":", 1)[-1]

    @property
    def in_handoff(self) -> bool:
        """True while a graceful handoff from `checkpoint_owner` to `lease_owner` is in progress."""
        return self.checkpoint_owner is not None

    def renewed_by(self, owner: str, counter: int, during_handoff: bool) -> bool:
        """Whether this row is what `owner`'s renewal of counter `counter` left.

        A retried renewal finds it so when its first attempt landed and the reply was lost.
        """
        holder = self.checkpoint_owner if during_handoff else self.lease_owner
        return holder == owner and self.in_handoff == during_handoff and self.lease_counter == counter + 1

    def handed_on_by(self, previous: str) -> bool:
        """Whether this row is what `previous` completing its handoff left: no handoff running, another owner.

        A retried completion (or final handoff checkpoint) whose first attempt landed finds it so. A row a receiver
        completed for an overdue `previous` looks the same, and means the same to `previous`: the lease moved on.
        """
        return self.checkpoint_owner is None and self.lease_owner != previous

    @property
    def released(self) -> bool:
        """Whether this row is what a release left: no owner, no handoff.

        A retried release whose first attempt landed finds it so; only a release clears the owner of a held lease.
        """
        return self.lease_owner is None and self.checkpoint_owner is None

    @property
    def is_paused(self) -> bool:
        """True while an operator's pause holds the shard (its owner keeps the lease but reads nothing)."""
        return self.paused is not None

    @property
    def pause_acknowledged(self) -> bool:
        """True once the worker processing the paused lease has stopped and said so."""
        return self.paused is not None and self.paused_by is not None and self.paused_by == self.actual_owner

    @property
    def is_finished(self) -> bool:
        """True once the shard was read to its end and checkpointed SHARD_END."""
        return self.checkpoint.is_shard_end

    def with_changes(self, **changes: object) -> Lease:
        """A copy with some fields replaced (the dataclass is frozen)."""
        return replace(self, **changes)  # type: ignore[arg-type]


def new_lease(
    shard_id: str,
    checkpoint: Checkpoint,
    parents: frozenset[str] = frozenset(),
    hash_range: tuple[str, str] | None = None,
) -> Lease:
    """A fresh, unowned lease for a shard as shard sync creates it."""
    start, end = hash_range if hash_range else (None, None)
    return Lease(
        lease_key=shard_id,
        checkpoint=checkpoint,
        parent_shard_ids=parents,
        starting_hash_key=start,
        ending_hash_key=end,
    )
