"""Worker records (`<app>-WorkerMetricStats`) and coordinator state (`<app>-CoordinatorState`) in DynamoDB."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shardherd.shared.dynamo.attributes import integer
from shardherd.shared.dynamo.base import DynamoAccess
from shardherd.shared.dynamo.expressions import Expression
from shardherd.shared.dynamo.state_codec import add_condition, decode_state, encode_state, state_key
from shardherd.shared.dynamo.worker_codec import (
    DRAIN_REQUESTED,
    RESTART_WITHIN,
    WORKER_ID,
    decode_worker,
    worker_key,
    worker_unchanged,
    worker_upsert,
)
from shardherd.shared.errors import MalformedWorker
from shardherd.shared.store import STATE_KEY_ATTRIBUTE, StateCondition, StateValue, WorkerScan
from shardherd.shared.worker import WorkerRecord


class WorkerAndStateRecords(DynamoAccess):
    """The worker-record and coordinator-state operations of the LeaseStore interface."""

    # ---------------------------------------------------------------- workers
    def upsert_worker(self, record: WorkerRecord) -> None:
        """UpdateItem of every worker-owned attribute (never `drainRequested`)."""
        self._call(lambda: self._client.update_item(
            TableName=self.tables.worker_metrics, Key=worker_key(record.worker_id),
            **worker_upsert(record).params()), f"UpdateItem worker {record.worker_id}")

    def scan_workers(self) -> WorkerScan:
        """Every worker record via a paginated Scan; unreadable ones are reported."""
        workers: list[WorkerRecord] = []
        malformed: list[MalformedWorker] = []
        for item in self._scan(self.tables.worker_metrics, 1000, f"Scan {self.tables.worker_metrics}"):
            try:
                workers.append(decode_worker(item, self.tables.worker_metrics))
            except MalformedWorker as exc:
                malformed.append(exc)
        return WorkerScan(workers, malformed)

    def get_worker(self, worker_id: str) -> WorkerRecord | None:
        """One consistent GetItem of the record; None if absent."""
        item = self._get(self.tables.worker_metrics, worker_key(worker_id), True, f"GetItem worker {worker_id}")
        return None if item is None else decode_worker(item, self.tables.worker_metrics)

    def set_drain_requested(self, worker_id: str, requested: bool) -> bool:
        """Set the operator drain flag on an existing record; False if there is none."""
        expression = Expression().require_present(WORKER_ID).set(DRAIN_REQUESTED, {"BOOL": requested})
        return self._conditional(lambda: self._client.update_item(
            TableName=self.tables.worker_metrics, Key=worker_key(worker_id), **expression.params()),
            f"UpdateItem drain {worker_id}")

    def set_restart(self, worker_id: str, within_ms: int | None) -> bool:
        """Set or remove the restart reservation of an existing record; False if there is none."""
        expression = Expression().require_present(WORKER_ID)
        if within_ms is None:
            expression.remove(RESTART_WITHIN)
        else:
            expression.set(RESTART_WITHIN, integer(within_ms))
        return self._conditional(lambda: self._client.update_item(
            TableName=self.tables.worker_metrics, Key=worker_key(worker_id), **expression.params()),
            f"UpdateItem restart reservation {worker_id}")

    def delete_worker_if_unchanged(self, worker_id: str, last_update: int, heartbeat: int) -> bool:
        """Delete a stale record only while `lut` and `hb` are still the values read."""
        expression = worker_unchanged(last_update, heartbeat)
        return self._conditional(lambda: self._client.delete_item(
            TableName=self.tables.worker_metrics, Key=worker_key(worker_id), **expression.params(update=False)),
            f"DeleteItem worker {worker_id}")

    # ---------------------------------------------------------------- coordinator state
    def get_state(self, key: str, consistent: bool = True) -> dict[str, StateValue] | None:
        """Read a coordinator-state item (consistent unless asked otherwise) without its hash key."""
        item = self._get(self.tables.coordinator_state, state_key(key), consistent, f"GetItem state {key}")
        return None if item is None else decode_state(item)

    def put_state(self, key: str, attributes: Mapping[str, StateValue],
                  condition: StateCondition | None = None) -> bool:
        """PutItem replacing the whole item if `condition` holds."""
        item = encode_state(key, attributes)
        expression = add_condition(Expression(), condition)
        return self._conditional(lambda: self._client.put_item(
            TableName=self.tables.coordinator_state, Item=item, **expression.params(update=False)),
            f"PutItem state {key}")

    def update_state(self, key: str, set_attributes: Mapping[str, StateValue],
                     remove: Sequence[str] = (), condition: StateCondition | None = None) -> bool:
        """UpdateItem of an existing item if `condition` holds."""
        if not set_attributes and not remove:
            raise ValueError(f"update_state {key!r}: nothing to set or remove")
        if STATE_KEY_ATTRIBUTE in set_attributes or STATE_KEY_ATTRIBUTE in remove:
            raise ValueError(f"update_state {key!r}: the hash key {STATE_KEY_ATTRIBUTE!r} cannot be changed")
        expression = add_condition(Expression().require_present(STATE_KEY_ATTRIBUTE), condition)
        for name, value in encode_state(key, set_attributes).items():
            if name != STATE_KEY_ATTRIBUTE:
                expression.set(name, value)
        for name in remove:
            expression.remove(name)
        return self._conditional(lambda: self._client.update_item(
            TableName=self.tables.coordinator_state, Key=state_key(key), **expression.params()),
            f"UpdateItem state {key}")

    def delete_state(self, key: str, condition: StateCondition | None = None) -> bool:
        """DeleteItem of an existing item if `condition` holds."""
        expression = add_condition(Expression().require_present(STATE_KEY_ATTRIBUTE), condition)
        return self._conditional(lambda: self._client.delete_item(
            TableName=self.tables.coordinator_state, Key=state_key(key), **expression.params(update=False)),
            f"DeleteItem state {key}")
