"""`shardherd check-table`: what shardherd will do with every row of an existing KCL table, before it runs on it.

For each row of the lease table (and of `<table>-WorkerMetricStats` and `<table>-CoordinatorState` when they exist)
the verdict is one of:

* `continue`: shardherd uses the row as it is (a lease is processed from its checkpoint, a worker row is read by
  the leader, the lock item is contended for);
* `ignore`: shardherd leaves the row alone, untouched (KCL-only state, a stream the application does not read);
* `refuse`: shardherd cannot use the row and reports it (unreadable attributes, a malformed key, a checkpoint it
  cannot start from); the row is never changed or dropped, but its shard is not processed until it is fixed.

The verdicts come from the code the running system uses: the DynamoDB codecs (shared/dynamo), the leader's lease
scope (coordinator/stream_sync.py), the agent's start position (agent/shard_worker.py). The table is only read.
Exit status: 0 when nothing is refused, 1 when a row is refused, 2 on usage or access errors (one-line message).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from shardherd.agent.shard_worker import start_position
from shardherd.coordinator.leader_lock import EPOCH_COUNTER_SUFFIX, LOCK_KEY
from shardherd.coordinator.stream_sync import scope_problem
from shardherd.services.leader_status import STATUS_KEY
from shardherd.services.replicas import REPLICAS_KEY
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import Sentinel
from shardherd.shared.config import Settings, StreamSpec, load_settings
from shardherd.shared.dynamo import lease_codec as lc
from shardherd.shared.dynamo.worker_codec import decode_worker
from shardherd.shared.errors import MalformedRow, ShardherdError
from shardherd.shared.lease import Lease
from shardherd.shared.store import STATE_KEY_ATTRIBUTE, TableNames
from shardherd.shared.streams import MalformedLeaseKey, StreamIdentifier, lease_address, stream_name_of

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

Verdict = Literal["continue", "ignore", "refuse"]
WORKER_ID_ATTRIBUTE = "wid"
# KCL-only items of the coordinator state table (client-version and single-table migration state).
KCL_STATE_ITEMS = frozenset({"Migration3.0", "TableMigration3.5"})


class TableNotFound(ShardherdError):
    """The lease table to check does not exist."""


@dataclass(frozen=True, slots=True)
class RowVerdict:
    """What shardherd does with one row: `row` is its key (lease key, worker id, state item key)."""

    row: str
    verdict: Verdict
    reason: str


@dataclass(frozen=True, slots=True)
class Scope:
    """The leases the application processes: its mode and, for multi-stream, its streams' configured parts."""

    multi_stream: bool
    settings: Settings

    def problem(self, lease: Lease) -> str | None:
        """Why the running system leaves `lease` alone (None if it processes it); MalformedLeaseKey for a bad key."""
        stream = lease_address(lease).stream
        if not self.multi_stream:
            return scope_problem(lease, None)
        if stream is None:
            return scope_problem(lease, frozenset())
        spec = next((spec for spec in self.settings.streams if spec.name == stream.name), None)
        if spec is None:
            return scope_problem(lease, frozenset())
        # The coordinator fills unconfigured parts from DescribeStreamSummary; configured ones must match.
        wanted = StreamIdentifier(spec.account_id or stream.account_id, stream.name,
                                  stream.creation_epoch if spec.creation_epoch is None else spec.creation_epoch)
        return scope_problem(lease, frozenset({wanted}))


def infer_scope(settings: Settings, leases: list[Lease]) -> Scope:
    """The configured mode, or (nothing configured) the key format most of the table's leases use.

    An inferred multi-stream application reads every stream its keys name.
    """
    if settings.stream_name is not None or settings.streams:
        return Scope(settings.multi_stream, settings)
    named = [(lease, stream_name_of(lease)) for lease in leases]
    streams = {name for _, name in named if name is not None}
    single = sum(1 for lease, name in named if name is None and ":" not in lease.lease_key)
    multi = sum(1 for _, name in named if name is not None)
    if multi <= single:
        return Scope(False, settings)
    specs = tuple(StreamSpec.model_validate({"name": name}) for name in sorted(streams))
    return Scope(True, settings.model_copy(update={"streams": specs}))


# ---------------------------------------------------------------------------------------------------- lease rows
def judge_lease_item(item: dict[str, Any], lease: Lease | None, scope: Scope, table: str) -> RowVerdict:
    """The verdict on one lease-table item; `lease` is its decoded form (None if it is not a lease item)."""
    key = lc.item_key(item) or "<no leaseKey>"
    if lease is None:
        entity = item.get(lc.ENTITY_TYPE, {}).get("S")
        if entity == "WORKER_METRIC_STATS":
            return RowVerdict(key, "ignore", "KCL 3.5 worker metrics entity in the lease table; shardherd reads "
                                             f"worker metrics from {table}-WorkerMetricStats only")
        if entity == "LEADER":
            return RowVerdict(key, "ignore", "KCL 3.5 leader lock entity in the lease table; shardherd's lock is "
                                             f"the {LOCK_KEY} item of {table}-CoordinatorState")
        return RowVerdict(key, "ignore", f"entityType {entity!r} is not a lease")
    try:
        problem = scope.problem(lease)
    except MalformedLeaseKey as exc:
        return RowVerdict(key, "refuse", f"malformed lease key: {exc.reason}")
    if problem is not None:
        return RowVerdict(key, "ignore", f"left alone: {problem}")
    stream = stream_name_of(lease)
    timestamp = scope.settings.initial_position_for(stream)[1]
    try:
        start_position(lease, timestamp)
    except ValueError as exc:
        return RowVerdict(key, "refuse", f"cannot start: {exc}")
    return RowVerdict(key, "continue", "; ".join(_lease_notes(lease, stream)))


def _lease_notes(lease: Lease, stream: str | None) -> Iterator[str]:
    where = f"stream {stream} shard {lease.shard}" if stream else f"shard {lease.shard}"
    checkpoint = lease.checkpoint
    if checkpoint.sentinel is Sentinel.SHARD_END:
        yield f"{where} finished (SHARD_END); deleted by shard sync once its children have started"
    elif checkpoint.sentinel is not None:
        yield f"{where} not started: reads from {checkpoint.sentinel.value}"
    else:
        yield f"{where} resumes after sequence number {checkpoint.sequence_number}" + (
            f" sub {checkpoint.sub_sequence_number}" if checkpoint.sub_sequence_number else "")
    if lease.pending_checkpoint is not None:
        yield f"pending checkpoint {lease.pending_checkpoint.sequence_number} kept"
    if lease.checkpoint_owner is not None:
        yield f"handoff from {lease.checkpoint_owner} to {lease.lease_owner} in progress"
    elif lease.lease_owner is not None:
        yield f"owned by {lease.lease_owner} (moves if that worker stops renewing)"
    else:
        yield "unowned: the leader assigns it"
    if lease.parent_shard_ids:
        yield f"child of {', '.join(sorted(lease.parent_shard_ids))}"
    if lease.child_shard_ids:
        yield f"parent of {', '.join(sorted(lease.child_shard_ids))}"
    yield from lease.repairs


# ---------------------------------------------------------------------------------------------------- other tables
def judge_worker_item(item: dict[str, Any], table: str) -> RowVerdict:
    """The verdict on one worker-metrics item: read by the leader, or refused (reported, left untouched)."""
    key = item.get(WORKER_ID_ATTRIBUTE, {}).get("S") or "<no wid>"
    try:
        record = decode_worker(item, table)
    except MalformedRow as exc:
        return RowVerdict(key, "refuse", f"worker metrics row unreadable: {exc.reason}")
    basis = "CPU" if record.metric_stats else "no metrics (balanced by lease throughput, KCL's default metric)"
    notes = [f"worker metrics row read by the leader ({basis})", *record.repairs]
    return RowVerdict(key, "continue", "; ".join(notes))


def judge_state_item(item: dict[str, Any]) -> RowVerdict:
    """The verdict on one coordinator-state item."""
    key = item.get(STATE_KEY_ATTRIBUTE, {}).get("S") or "<no key>"
    if key == LOCK_KEY:
        return RowVerdict(key, "continue", "coordinator state: the leader lock (lock-client format); shardherd "
                                           "coordinators contend for it as KCL workers do")
    if key == LOCK_KEY + EPOCH_COUNTER_SUFFIX:
        return RowVerdict(key, "continue", "coordinator state: shardherd's leader epoch counter (each leadership's "
                                           "fencing epoch; KCL does not read it)")
    if key in (STATUS_KEY, REPLICAS_KEY):
        return RowVerdict(key, "continue", "coordinator state: shardherd's own item")
    if key.startswith("spark-end/"):  # agent/spark/batch_ends.py
        return RowVerdict(key, "continue", "coordinator state: where a Spark batch's read of a shard stopped "
                                           "(shardherd's own item, deleted when the hold ends)")
    if key in KCL_STATE_ITEMS:
        return RowVerdict(key, "ignore", "coordinator state: KCL migration state, not used by shardherd")
    return RowVerdict(key, "ignore", "coordinator state: not used by shardherd (e.g. KCL multi-stream stream info)")


# ---------------------------------------------------------------------------------------------------- reading
def _scan(client: DynamoDBClient, table: str) -> Iterator[dict[str, Any]]:
    for page in client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
        yield from page.get("Items", [])


def _exists(client: DynamoDBClient, table: str) -> bool:
    try:
        client.describe_table(TableName=table)
    except client.exceptions.ResourceNotFoundException:
        return False
    return True


def check_table(client: DynamoDBClient, table: str, settings: Settings) -> list[RowVerdict]:
    """Every row's verdict: the lease table's, then the worker metrics and coordinator state tables' if present."""
    if not _exists(client, table):
        raise TableNotFound(f"table {table} not found")
    items = list(_scan(client, table))
    decoded: list[tuple[dict[str, Any], Lease | None, MalformedRow | None]] = []
    for item in items:
        if not lc.is_lease_item(item):
            decoded.append((item, None, None))
            continue
        try:
            decoded.append((item, lc.decode_lease(item, table), None))
        except MalformedRow as exc:
            decoded.append((item, None, exc))
    scope = infer_scope(settings, [lease for _, lease, _ in decoded if lease is not None])
    verdicts = []
    for item, lease, error in decoded:
        if error is not None:
            verdicts.append(RowVerdict(error.key or "<no leaseKey>", "refuse", f"unreadable lease: {error.reason}"))
        else:
            verdicts.append(judge_lease_item(item, lease, scope, table))
    names = TableNames.for_application(table)
    if _exists(client, names.worker_metrics):
        verdicts.extend(judge_worker_item(item, names.worker_metrics) for item in _scan(client, names.worker_metrics))
    if _exists(client, names.coordinator_state):
        verdicts.extend(judge_state_item(item) for item in _scan(client, names.coordinator_state))
    return verdicts


# ---------------------------------------------------------------------------------------------------- command
def register(sub: Any) -> None:
    """Add the `check-table` subcommand."""
    parser = sub.add_parser("check-table", help="say what shardherd will do with every row of a KCL table",
                            description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--table", required=True, help="the lease table (KCL: the application name)")
    parser.add_argument("--endpoint-url", help="DynamoDB endpoint (default: settings, else the regional one)")
    parser.add_argument("--region", help="AWS region (default: settings, else us-east-1)")
    parser.add_argument("--json", action="store_true", help="a JSON list of {row, verdict, reason}")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check the table and print the verdicts; 1 if any row is refused."""
    logging.getLogger("shardherd.shared.row_checks").setLevel(logging.ERROR)  # every problem is in the verdicts instead
    settings = load_settings()
    client = make_client("dynamodb", args.region or settings.region, args.endpoint_url or
                         settings.dynamodb_endpoint_url)
    verdicts = check_table(client, args.table, settings)
    if args.json:
        print(json.dumps([asdict(verdict) for verdict in verdicts], indent=2))
    else:
        for verdict in verdicts:
            print(f"{verdict.verdict} {verdict.row} {verdict.reason}")
        counts = Counter(verdict.verdict for verdict in verdicts)
        print(f"{len(verdicts)} rows: {counts['continue']} continue, {counts['ignore']} ignore, "
              f"{counts['refuse']} refuse")
    return 1 if any(verdict.verdict == "refuse" for verdict in verdicts) else 0
