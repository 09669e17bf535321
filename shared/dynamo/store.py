"""DynamoDB backend of the LeaseStore: KCL 3.x tables, one conditional request per write, typed lost races."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.dynamo import lease_codec as lc
from shardherd.shared.dynamo.attributes import integer, rounded_micro, string
from shardherd.shared.dynamo.errors import ConditionFailed, TransactionCanceled
from shardherd.shared.dynamo.expressions import Expression, Item
from shardherd.shared.dynamo.records import WorkerAndStateRecords
from shardherd.shared.dynamo.state_codec import add_condition, state_key
from shardherd.shared.dynamo.tables import Capacity, TableManager
from shardherd.shared.errors import MalformedLease, StoreError, StoreUnavailable
from shardherd.shared.lease import Lease
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.rounding import round_throughput
from shardherd.shared.store import (
    LEASE_OWNER_INDEX,
    STATE_KEY_ATTRIBUTE,
    Conflict,
    Fence,
    LeaseScan,
    LeaseStore,
    Outcome,
    TableNames,
)
from shardherd.shared.worker import LeaseProgress

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# How often a checkpoint re-reads and retries when the stored checkpoint moved between its read and its write.
CHECKPOINT_ATTEMPTS = 5
_CONDITION_FAILED = "ConditionalCheckFailed"

Classifier = Callable[[Lease | None], Conflict]


def _not_found_or_ownership(current: Lease | None) -> Conflict:
    return Conflict.NOT_FOUND if current is None else Conflict.OWNERSHIP


def _existing_lease() -> Expression:
    """A fresh expression requiring that the row exists and is a lease (not a KCL 3.5 single-table entity)."""
    return (Expression().require_present(lc.LEASE_KEY)
            .require_absent_or_equal(lc.ENTITY_TYPE, string(lc.LEASE_ENTITY)))


def _require_checkpoint(expression: Expression, checkpoint: Checkpoint) -> Expression:
    """Condition: the stored checkpoint (and sub-sequence; absent counts as 0) equals `checkpoint` exactly."""
    expression.require_equal(lc.CHECKPOINT, string(checkpoint.sequence_number))
    sub = integer(checkpoint.sub_sequence_number)
    if checkpoint.sub_sequence_number == 0:
        return expression.require_absent_or_equal(lc.CHECKPOINT_SUB, sub)
    return expression.require_equal(lc.CHECKPOINT_SUB, sub)


class DynamoLeaseStore(WorkerAndStateRecords, LeaseStore):
    """Leases, worker records and coordinator state of one application in DynamoDB, via the low-level client."""

    def __init__(self, client: DynamoDBClient, tables: TableNames, retry: RetryPolicy | None = None,
                 billing_mode: str = "PAY_PER_REQUEST", read_capacity: int = 10, write_capacity: int = 10,
                 consistent_reads: bool = True) -> None:
        super().__init__(client, tables, retry, consistent_reads)
        self._capacity = Capacity(billing_mode, read_capacity, write_capacity)
        # Page size of the owner-index query (DynamoDB's 1 MB page when None); settable for tests and tuning.
        self.owner_query_page_size: int | None = None

    # ---------------------------------------------------------------- schema
    def ensure_tables(self) -> None:
        """Create missing tables (and the owner index on a KCL 2.x lease table) and wait until ACTIVE."""
        TableManager(self._client, self.tables, self._retry, self._capacity).ensure_all()

    def close(self) -> None:
        """Close the client's connection pool."""
        self._client.close()

    # ---------------------------------------------------------------- plumbing
    def _lease_from(self, item: Item | None) -> Lease | None:
        if item is None or not lc.is_lease_item(item):
            return None
        return lc.decode_lease(item, self.tables.leases)

    def _read_lease(self, lease_key: str, consistent: bool = True) -> Lease | None:
        return self._lease_from(self._get(self.tables.leases, lc.key_of(lease_key), consistent,
                                          f"GetItem {lease_key}"))

    def _current(self, lease_key: str, returned: Item | None) -> Lease | None:
        """The row after a lost condition: the returned old item, else a consistent read."""
        return self._lease_from(returned) if returned is not None else self._read_lease(lease_key)

    def _fence_check(self, fence: Fence) -> dict[str, Any]:
        expression = add_condition(Expression(), fence.expect)
        if not fence.expect:
            expression.require_present(STATE_KEY_ATTRIBUTE)
        return {"ConditionCheck": {"TableName": self.tables.coordinator_state, "Key": state_key(fence.key),
                                   "ReturnValuesOnConditionCheckFailure": "NONE",
                                   **expression.params(update=False)}}

    def _write(self, lease_key: str, expression: Expression, what: str, fence: Fence | None = None,
               classify: Classifier = _not_found_or_ownership, delete: bool = False,
               own_result: Callable[[Lease], bool] | None = None) -> Outcome:
        """One conditional UpdateItem/DeleteItem (a transaction with the fence's ConditionCheck when fenced).

        `own_result` recognises the row this very write produces: when a retried request finds its condition
        failing and the row already looks like that, the earlier attempt was applied and only its reply was lost.
        """
        key = lc.key_of(lease_key)
        table = self.tables.leases
        params = {"TableName": table, "Key": key, "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                  **expression.params(update=not delete)}
        attempts: list[int] = []
        try:
            if fence is None:
                return self._unfenced_write(lease_key, params, what, delete, attempts)
            return self._fenced_write(lease_key, params, what, fence, delete)
        except ConditionFailed as lost:
            current = self._current(lease_key, lost.item)
            if len(attempts) > 1 and current is not None and own_result is not None and own_result(current):
                return Outcome.ok(current)
            return Outcome.lost(classify(current), current)
        except TransactionCanceled as canceled:
            codes = [reason.get("Code") for reason in canceled.reasons]
            if _CONDITION_FAILED not in codes:
                raise StoreError(f"{what} {lease_key}: transaction cancelled: {codes}") from None
            current = self._current(lease_key, canceled.reasons[1].get("Item") if len(codes) > 1 else None)
            conflict = Conflict.FENCED if codes[0] == _CONDITION_FAILED else classify(current)
            return Outcome.lost(conflict, current)

    def _unfenced_write(self, lease_key: str, params: dict[str, Any], what: str, delete: bool,
                        attempts: list[int]) -> Outcome:
        """One conditional DeleteItem or UpdateItem.

        `attempts` collects the update's tries: a retry may find its own earlier attempt applied.
        """
        if delete:
            response = self._call(lambda: self._client.delete_item(ReturnValues="ALL_OLD", **params),
                                  f"DeleteItem {what} {lease_key}")
        else:
            response = self._call(lambda: self._client.update_item(ReturnValues="ALL_NEW", **params),
                                  f"UpdateItem {what} {lease_key}", attempts)
        return Outcome.ok(lc.decode_lease(response["Attributes"], self.tables.leases))

    def _fenced_write(self, lease_key: str, params: dict[str, Any], what: str, fence: Fence,
                      delete: bool) -> Outcome:
        """The write in a transaction with the fence's ConditionCheck.

        A transaction returns no item: the lease is read back (or first, for a delete).
        """
        before = self._read_lease(lease_key) if delete else None
        transaction = [self._fence_check(fence), {"Delete" if delete else "Update": params}]
        request: dict[str, Any] = {"TransactItems": transaction}
        self._call(lambda: self._client.transact_write_items(**request), f"TransactWriteItems {what} {lease_key}")
        after = before if delete else self._read_lease(lease_key)
        if after is None:
            raise StoreError(f"{what} {lease_key}: the lease vanished right after an applied write")
        return Outcome.ok(after)

    # ---------------------------------------------------------------- lease reads
    def get_lease(self, lease_key: str) -> Lease | None:
        """Read one lease (consistent unless configured otherwise); None if absent or not a lease item."""
        return self._read_lease(lease_key, self._consistent_reads)

    def scan_leases(self, page_size: int = 1000) -> LeaseScan:
        """Every lease via a paginated Scan; unreadable rows are reported, never touched."""
        leases: list[Lease] = []
        malformed: list[MalformedLease] = []
        for item in self._scan(self.tables.leases, page_size, f"Scan {self.tables.leases}"):
            if not lc.is_lease_item(item):
                continue
            try:
                leases.append(lc.decode_lease(item, self.tables.leases))
            except MalformedLease as exc:
                malformed.append(exc)
        return LeaseScan(leases, malformed)

    def list_owned_keys(self, owner: str) -> list[str]:
        """Keys owned by `owner`, from every page of the `LeaseOwnerToLeaseKeyIndex` query."""
        expression = Expression()
        condition = f"{expression.name(lc.LEASE_OWNER)} = {expression.value(string(owner))}"
        params: dict[str, Any] = {"TableName": self.tables.leases, "IndexName": LEASE_OWNER_INDEX,
                                  "KeyConditionExpression": condition, **expression.params()}
        if self.owner_query_page_size is not None:
            params["Limit"] = self.owner_query_page_size
        keys: list[str] = []
        while True:
            response = self._call(lambda: self._client.query(**params), f"Query {LEASE_OWNER_INDEX} {owner}")
            keys.extend(key for item in response.get("Items", []) if (key := lc.item_key(item)) is not None)
            last = response.get("LastEvaluatedKey")
            if not last:
                return keys
            params["ExclusiveStartKey"] = last

    # ---------------------------------------------------------------- lease writes
    def create_lease(self, lease: Lease) -> Outcome:
        """PutItem if no row has the key; ALREADY_EXISTS (with the current row, None if unreadable) otherwise."""
        item = {**lc.encode_lease(lease), lc.ENTITY_TYPE: string(lc.LEASE_ENTITY)}
        expression = Expression().require_absent(lc.LEASE_KEY)
        try:
            self._call(lambda: self._client.put_item(
                TableName=self.tables.leases, Item=item, ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **expression.params(update=False)), f"PutItem create {lease.lease_key}")
        except ConditionFailed as lost:
            try:
                current = self._current(lease.lease_key, lost.item)
            except MalformedLease:  # reported by the decoder; the row stays as it is
                current = None
            return Outcome.lost(Conflict.ALREADY_EXISTS, current)
        return Outcome.ok(lc.decode_lease(item, self.tables.leases))

    def renew(self, lease_key: str, owner: str, expected_counter: int, throughput_kbps: float | None = None,
              during_handoff: bool = False) -> Outcome:
        """Counter+1 if owner (or, during a handoff, checkpoint owner) and counter match."""
        expression = _existing_lease()
        if during_handoff:
            expression.require_string(lc.CHECKPOINT_OWNER, owner)
        else:
            expression.require_string(lc.LEASE_OWNER, owner).require_absent(lc.CHECKPOINT_OWNER)
        expression.require_equal(lc.LEASE_COUNTER, integer(expected_counter))
        expression.set(lc.LEASE_COUNTER, integer(expected_counter + 1))
        stored_throughput = None if throughput_kbps is None else rounded_micro(round_throughput(throughput_kbps))
        if stored_throughput is not None:
            expression.set(lc.THROUGHPUT_KBPS, stored_throughput)

        def renewed_by_me(current: Lease) -> bool:
            return current.renewed_by(owner, expected_counter, during_handoff) and (
                stored_throughput is None or current.throughput_kbps == float(stored_throughput["N"]))

        return self._write(lease_key, expression, "renew", own_result=renewed_by_me)

    def assign(self, lease_key: str, new_owner: str, expected_owner: str | None,
               expected_checkpoint_owner: str | None, fence: Fence | None = None, move: str | None = None) -> Outcome:
        """Leader assignment conditioned on both owner fields (never on the counter)."""
        expression = (_existing_lease().require_string(lc.LEASE_OWNER, expected_owner)
                      .require_string(lc.CHECKPOINT_OWNER, expected_checkpoint_owner))
        expression.set(lc.LEASE_OWNER, string(new_owner)).remove(lc.CHECKPOINT_OWNER).add(lc.LEASE_COUNTER, 1)
        if (expected_owner is not None and expected_owner != new_owner) or expected_checkpoint_owner == new_owner:
            expression.add(lc.OWNER_SWITCHES, 1)
        lc.set_last_move(expression, move)
        return self._write(lease_key, expression, "assign", fence)

    def start_handoff(self, lease_key: str, new_owner: str, current_owner: str,
                      fence: Fence | None = None, move: str | None = None) -> Outcome:
        """Handoff start: leaseOwner := new, checkpointOwner := current, if current owns it and none runs."""
        expression = (_existing_lease().require_string(lc.LEASE_OWNER, current_owner)
                      .require_absent(lc.CHECKPOINT_OWNER))
        expression.set(lc.LEASE_OWNER, string(new_owner)).set(lc.CHECKPOINT_OWNER, string(current_owner))
        lc.set_last_move(expression, move)
        return self._write(lease_key, expression, "start_handoff", fence)

    def complete_handoff(self, lease_key: str, checkpoint_owner: str) -> Outcome:
        """The draining owner ends the handoff: checkpointOwner removed, counter+1, ownerSwitches+1."""
        expression = _existing_lease().require_string(lc.CHECKPOINT_OWNER, checkpoint_owner)
        expression.remove(lc.CHECKPOINT_OWNER).add(lc.LEASE_COUNTER, 1).add(lc.OWNER_SWITCHES, 1)
        return self._write(lease_key, expression, "complete_handoff",
                           own_result=lambda current: current.handed_on_by(checkpoint_owner))

    def checkpoint(self, lease_key: str, worker: str, checkpoint: Checkpoint,
                   progress: LeaseProgress | None = None, expected: Lease | None = None,
                   hand_over: bool = False) -> Outcome:
        """Monotonic checkpoint: read, check, then a write conditioned on the exact stored checkpoint and owners.

        With `expected` (the caller's last sight of the row) the read is skipped: one request instead of two when it
        is current, which it is for an owner checkpointing its own lease; a stale one fails its condition and the
        write is retried from the row the refusal returns. If the stored checkpoint moved under each of
        `CHECKPOINT_ATTEMPTS` writes while the lease stayed ours, StoreUnavailable: the caller keeps the lease and
        retries later (an OWNERSHIP outcome would make it drop a lease it still owns).
        """
        current = expected if expected is not None and expected.lease_key == lease_key else self._read_lease(lease_key)
        for attempt in range(CHECKPOINT_ATTEMPTS + 1):
            if current is None:
                return Outcome.lost(Conflict.NOT_FOUND, None)
            if current.actual_owner != worker:
                return Outcome.lost(Conflict.OWNERSHIP, current)
            if checkpoint.regresses_from(current.checkpoint):
                return Outcome.lost(Conflict.STALE_CHECKPOINT, current)
            if attempt == CHECKPOINT_ATTEMPTS:
                break
            handing = hand_over and current.checkpoint_owner == worker
            update = self._checkpoint_update(current, checkpoint, handing)
            if progress is not None:
                lc.set_progress(update, progress)
            outcome = self._write(lease_key, update, "checkpoint", own_result=(
                lambda row: row.checkpoint == checkpoint and row.handed_on_by(worker)) if handing else None)
            if outcome.applied:
                return outcome
            current = outcome.lease
        raise StoreUnavailable(f"checkpoint {lease_key}: the stored checkpoint moved under each of "
                               f"{CHECKPOINT_ATTEMPTS} writes; the lease is still {worker}'s")

    @staticmethod
    def _checkpoint_update(current: Lease, checkpoint: Checkpoint, hand_over: bool) -> Expression:
        """The conditional update of one checkpoint attempt; KCL's pending-checkpoint fields go, as KCL's own do."""
        expression = _require_checkpoint(_existing_lease(), current.checkpoint)
        if current.checkpoint_owner is None:
            expression.require_string(lc.LEASE_OWNER, current.lease_owner).require_absent(lc.CHECKPOINT_OWNER)
        else:
            expression.require_string(lc.CHECKPOINT_OWNER, current.checkpoint_owner)
        sequence, sub = lc.checkpoint_attributes(checkpoint)
        expression.set(lc.CHECKPOINT, sequence).set(lc.CHECKPOINT_SUB, sub)
        expression.set(lc.OWNER_SWITCHES, integer(int(hand_over))).add(lc.LEASE_COUNTER, 1)
        if hand_over:  # the handoff completes in this write (the condition above names us its checkpoint owner)
            expression.remove(lc.CHECKPOINT_OWNER)
        for name in (lc.PENDING_CHECKPOINT, lc.PENDING_CHECKPOINT_SUB, lc.PENDING_CHECKPOINT_STATE):
            expression.remove(name)
        return expression

    def release(self, lease_key: str, owner: str) -> Outcome:
        """The owner gives the lease up (no handoff running): leaseOwner removed, counter+1."""
        expression = (_existing_lease().require_string(lc.LEASE_OWNER, owner)
                      .require_absent(lc.CHECKPOINT_OWNER))
        expression.remove(lc.LEASE_OWNER).add(lc.LEASE_COUNTER, 1)
        return self._write(lease_key, expression, "release", own_result=lambda current: current.released)

    def set_pause(self, lease_key: str, reason: str | None) -> Outcome:
        """SET the pause reason, or REMOVE the pause and its acknowledgement; owners and counter untouched."""
        expression = _existing_lease()
        if reason is None:
            expression.remove(lc.PAUSED).remove(lc.PAUSED_BY)
        else:
            expression.set(lc.PAUSED, string(reason))
        return self._write(lease_key, expression, "set_pause")

    def acknowledge_pause(self, lease_key: str, worker: str) -> Outcome:
        """`shardherdPausedBy := worker` while paused and `worker` is the actual owner."""
        expression = _existing_lease().require_present(lc.PAUSED)
        name, value = expression.name(lc.CHECKPOINT_OWNER), expression.value(string(worker))
        owner = expression.name(lc.LEASE_OWNER)
        expression.require(f"({name} = {value} OR (attribute_not_exists({name}) AND {owner} = {value}))")
        expression.set(lc.PAUSED_BY, string(worker))
        return self._write(lease_key, expression, "acknowledge_pause")

    def rewrite_checkpoint(self, lease_key: str, expected: Lease, checkpoint: Checkpoint,
                           fence: Fence | None = None) -> Outcome:
        """Any checkpoint for a paused lease still as `expected` (owners, checkpoint, acknowledgement); counter+1."""
        expression = _require_checkpoint(_existing_lease(), expected.checkpoint).require_present(lc.PAUSED)
        expression.require_string(lc.LEASE_OWNER, expected.lease_owner)
        expression.require_string(lc.CHECKPOINT_OWNER, expected.checkpoint_owner)
        expression.require_string(lc.PAUSED_BY, expected.paused_by)
        sequence, sub = lc.checkpoint_attributes(checkpoint)
        expression.set(lc.CHECKPOINT, sequence).set(lc.CHECKPOINT_SUB, sub).add(lc.LEASE_COUNTER, 1)
        for name in (lc.PENDING_CHECKPOINT, lc.PENDING_CHECKPOINT_SUB, lc.PENDING_CHECKPOINT_STATE):
            expression.remove(name)
        return self._write(lease_key, expression, "rewrite_checkpoint", fence)

    def delete_lease(self, lease_key: str, expected_checkpoint: Checkpoint | None = None,
                     fence: Fence | None = None) -> Outcome:
        """Delete the lease (while its checkpoint still equals `expected_checkpoint`, if given)."""
        expression = _existing_lease()
        if expected_checkpoint is not None:
            _require_checkpoint(expression, expected_checkpoint)

        def classify(current: Lease | None) -> Conflict:
            if current is not None and expected_checkpoint is not None and current.checkpoint != expected_checkpoint:
                return Conflict.STALE_CHECKPOINT
            return _not_found_or_ownership(current)

        return self._write(lease_key, expression, "delete", fence, classify, delete=True)
