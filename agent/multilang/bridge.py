"""The RecordProcessor that runs a MultiLang record processor executable for one shard and speaks its protocol.

Invariants:
- one child per shard at a time; every action waits for the child's `status` for that action, answering each
  `checkpoint` request in between (the daemon's call and response);
- a checkpoint is written only inside processRecords, shutdownRequested and shardEnded (elsewhere the answer is
  InvalidStateException), only between the last checkpoint and the last record delivered (SHARD_END in shardEnded),
  else IllegalArgumentException, as KCL's checkpointer; a lost lease answers ShutdownException;
- a child that exits, hangs past `timeoutInSeconds` or breaks the protocol during processRecords is killed, and the
  same batch raises: the shard worker delivers it again (never skipped) to a new child, initialized at the last
  checkpoint (the daemon would exit the whole JVM instead);
- shutdownRequested is followed by leaseLost and end of input, as the daemon's graceful shutdown does; shardEnded
  must be answered with the SHARD_END checkpoint (KCL requires it before the shard's children start). One call is one
  attempt; a child that answers without it has ended, and the shard worker calls again after a growing wait (a new
  child, initialized at the last checkpoint, gets shardEnded), with the shard shown stuck meanwhile
  (agent/shard_worker.py). The Java daemon asks its child once and then only logs, every task backoff, forever.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shardherd.agent.consumer import Checkpointer, LeaseLost, RecordProcessor
from shardherd.agent.multilang import messages
from shardherd.agent.multilang.child import ChildFailed, ChildProcess
from shardherd.agent.records import Record
from shardherd.shared.checkpoint import SHARD_END, Checkpoint, parse_checkpoint
from shardherd.shared.errors import InvalidCheckpoint, ShardherdError, StoreUnavailable

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class ChildOptions:
    """How to run the record processor executable and talk to it."""

    command: tuple[str, ...]
    workdir: Path
    env: Mapping[str, str] | None = None
    timeout: float | None = None  # seconds to wait for any answer (timeoutInSeconds); None: wait, logging
    call_for_empty: bool = False  # callProcessRecordsEvenForEmptyRecordList
    exit_grace: float = 10.0  # seconds a child may take to exit at end of its input


class MultiLangProcessor(RecordProcessor):
    """One shard's record processor executable behind shardherd's RecordProcessor interface."""

    def __init__(self, options: ChildOptions) -> None:
        self._options = options
        self._child: ChildProcess | None = None
        self._shard = "?"
        self._last = SHARD_END  # the last checkpoint: set by initialize
        self._largest = SHARD_END  # the largest checkpoint allowed now: set by initialize and each batch (its end)

    # ------------------------------------------------------------------ RecordProcessor
    def initialize(self, shard_id: str, start: Checkpoint) -> None:
        """Start the child and send it initialize (ChildFailed if it does not answer: the attempt is retried)."""
        self._shard = shard_id
        self._last = self._largest = start
        self._start_child()

    def process_records(self, records: list[Record], checkpointer: Checkpointer,
                        millis_behind_latest: int | None) -> None:
        """Send one batch; a failed child is replaced and the batch raises, to be delivered again."""
        if not records and not self._options.call_for_empty:
            return
        if self._child is None:
            log.warning("%s: restarting the record processor at checkpoint %s", self._shard, self._last)
            self._start_child()
        if records:  # the batch in hand: after a failed larger batch, a piece of it when the shard worker bisects it
            self._largest = max(self._last, records[-1].checkpoint)
        try:
            self._exchange(messages.PROCESS_RECORDS, messages.process_records(records, millis_behind_latest),
                           checkpointer)
        except ChildFailed:
            self._discard()
            raise

    def shutdown_requested(self, shard_id: str, checkpointer: Checkpointer) -> None:
        """The hand-off (or stop): the child's checkpoint here is the hand-off checkpoint; then leaseLost, end."""
        if self._child is None:
            log.warning("%s: no record processor running to checkpoint before the hand-off", shard_id)
            return
        try:
            self._exchange(messages.SHUTDOWN_REQUESTED, messages.bare(messages.SHUTDOWN_REQUESTED), checkpointer)
            self._exchange(messages.LEASE_LOST, messages.bare(messages.LEASE_LOST), None)
        except ChildFailed as exc:
            log.error("%s: the record processor failed while shutting down: %s", shard_id, exc)
        self._end()

    def lease_lost(self, shard_id: str) -> None:
        """Tell the child the shard is gone (it cannot checkpoint any more), then end it."""
        if self._child is None:
            return
        try:
            self._exchange(messages.LEASE_LOST, messages.bare(messages.LEASE_LOST), None)
        except ChildFailed as exc:
            log.error("%s: the record processor failed on leaseLost: %s", shard_id, exc)
        self._end()

    def shard_ended(self, shard_id: str, checkpointer: Checkpointer) -> None:
        """Every record was delivered: ask the child (a new one if none runs) for the SHARD_END checkpoint, once.

        The shard worker checks that SHARD_END was stored and calls again, with backoff, if not.
        """
        self._largest = SHARD_END
        try:
            if self._child is None:
                self._start_child()
            self._exchange(messages.SHARD_ENDED, messages.bare(messages.SHARD_ENDED), checkpointer)
        except ChildFailed:
            self._discard()
            raise
        self._end()

    # ------------------------------------------------------------------ the child
    def _start_child(self) -> None:
        options = self._options
        child = ChildProcess(options.command, options.workdir, self._shard, options.env)
        self._child = child
        try:
            self._exchange(messages.INITIALIZE, messages.initialize(self._shard, self._last), None)
        except ChildFailed:
            self._discard()
            raise

    def _discard(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.kill()

    def _end(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            code = child.close(self._options.exit_grace)
            log.info("%s: record processor exited with code %s", self._shard, code)

    def _exchange(self, action: str, line: bytes, checkpointer: Checkpointer | None) -> None:
        """Send `line`, answer checkpoint requests until the child's status for `action`."""
        child = self._child
        assert child is not None
        child.send(line, self._options.timeout, action)
        while True:
            message = child.next_message(self._options.timeout, action)
            if isinstance(message, messages.CheckpointRequest):
                error = self._checkpoint(message, checkpointer)
                child.send(messages.checkpoint_reply(message.sequence_number, message.sub_sequence_number, error),
                           self._options.timeout, "a checkpoint answer")
                continue
            if message.response_for != action:
                raise ChildFailed(f"{self._shard}: status for {message.response_for!r} while waiting for {action}")
            return

    def _checkpoint(self, request: messages.CheckpointRequest, checkpointer: Checkpointer | None) -> str | None:
        """Write the requested checkpoint; None when stored, else the name of the error the daemon would return."""
        if checkpointer is None:
            log.error("%s: checkpoint requested outside processRecords/shutdownRequested/shardEnded", self._shard)
            return messages.INVALID_STATE
        try:
            target = self._largest if request.sequence_number is None else parse_checkpoint(
                request.sequence_number, request.sub_sequence_number)
        except InvalidCheckpoint as exc:
            log.error("%s: checkpoint refused: %s", self._shard, exc)
            return messages.ILLEGAL_ARGUMENT
        if target < self._last or target > self._largest:
            log.error("%s: checkpoint %s refused: outside the last checkpoint %s and the last record delivered %s",
                      self._shard, target, self._last, self._largest)
            return messages.ILLEGAL_ARGUMENT
        if target == self._last:
            return None
        try:
            checkpointer.checkpoint(target)
        except LeaseLost as exc:
            log.warning("%s: %s", self._shard, exc)
            return messages.SHUTDOWN_EXCEPTION
        except StoreUnavailable as exc:
            log.warning("%s: checkpoint %s not stored: %s", self._shard, target, exc)
            return messages.DEPENDENCY_EXCEPTION
        except ShardherdError as exc:
            log.error("%s: checkpoint %s not stored: %s", self._shard, target, exc)
            return messages.INVALID_STATE
        self._last = target
        return None
