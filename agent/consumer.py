"""The consumer API for non-Spark users, in the spirit of KCL's record processor, and its checkpointer."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from shardherd.agent.records import Record
from shardherd.shared.checkpoint import SHARD_END, Checkpoint
from shardherd.shared.errors import ShardherdError
from shardherd.shared.store import Conflict

if TYPE_CHECKING:
    from shardherd.agent.lease_keeper import LeaseKeeper

log = logging.getLogger(__name__)


class LeaseLost(ShardherdError):
    """The shard is no longer this worker's: stop processing it (raised by checkpoints after ownership is lost)."""


class Checkpointer:
    """Writes checkpoints of one shard through the lease keeper: monotonic, sub-sequence aware, fenced by ownership."""

    def __init__(self, keeper: LeaseKeeper, lease_key: str) -> None:
        self._keeper = keeper
        self.lease_key = lease_key
        self.last_delivered: Record | None = None
        self.last_written: Checkpoint | None = None

    def checkpoint(self, at: Record | Checkpoint | None = None) -> bool:
        """Record progress up to `at` (default: the last record delivered); True if stored (or already passed).

        Raises LeaseLost when the shard has moved to another worker; nothing is written then.
        """
        if at is None:
            if self.last_delivered is None:
                return False
            at = self.last_delivered
        target = at.checkpoint if isinstance(at, Record) else at
        outcome = self._keeper.checkpoint(self.lease_key, target)
        if outcome.applied:
            self.last_written = target
            return True
        if outcome.conflict is Conflict.STALE_CHECKPOINT:
            log.info("%s: checkpoint %s is behind the stored one; kept the stored one", self.lease_key, target)
            return True
        raise LeaseLost(f"{self.lease_key}: lease lost ({outcome.conflict.value}); checkpoint {target} not written")


class RecordProcessor:
    """Subclass and override `process_records`; one instance per shard, called from that shard's thread.

    Every record is delivered once per process lifetime in order; after a restart or a move, records after the last
    checkpoint are delivered again (at least once). An exception from `process_records` does not skip the batch: the
    same records are delivered again after a backoff.
    """

    def initialize(self, shard_id: str, start: Checkpoint) -> None:
        """Called once before the first batch, with the checkpoint the shard resumes from."""

    def process_records(self, records: list[Record], checkpointer: Checkpointer,
                        millis_behind_latest: int | None) -> None:
        """Handle a batch (possibly empty while the shard is idle); checkpoint when your output is durable."""
        raise NotImplementedError

    def shutdown_requested(self, shard_id: str, checkpointer: Checkpointer) -> None:
        """The shard is being handed to another worker: make output durable; by default checkpoint all delivered."""
        checkpointer.checkpoint()

    def shard_ended(self, shard_id: str, checkpointer: Checkpointer) -> None:
        """Every record of a closed shard was delivered: checkpoint SHARD_END so its children can start."""
        checkpointer.checkpoint(SHARD_END)

    def lease_lost(self, shard_id: str) -> None:
        """The shard moved away without a handoff (this worker was judged dead, or fenced itself): drop its state."""
