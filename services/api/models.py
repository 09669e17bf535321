"""Response bodies of the operator API (documented in the OpenAPI schema)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from shardherd.coordinator.moves import Move, Unplaced
from shardherd.services.leader_status import MAX_DETAIL_CHARS, Decision, LeaderStatus

LeaseState = Literal["owned", "unassigned", "handoff", "finished", "expired", "reserved"]
WorkerStateName = Literal["active", "draining", "expired", "restarting"]


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: a one-line explanation."""

    detail: str


class MalformedRow(BaseModel):
    """A stored row that could not be read (reported, left untouched), or whose unusable values were ignored."""

    key: str | None
    reason: str


class WorkerOut(BaseModel):
    """One worker as this replica sees it."""

    worker_id: str
    state: WorkerStateName = Field(description="expired: row unchanged for longer than the leader's grace for its kind "
                                   "of worker (agent: the failover time; KCL worker: two reporter intervals)")
    reported_state: str = Field(description="what the worker says about itself (ACTIVE or DRAINING)")
    drain_requested: bool
    restart_within_ms: int | None = Field(None, description="a restart reservation (decision 0035): the worker keeps "
                                          "its leases while its row is silent less than this; state restarting then")
    heartbeat: int
    heartbeat_age_seconds: float = Field(
        description="seconds since this replica saw the heartbeat counter change; before it has seen a change, the "
                    "age of the worker's own last-update time (wall clocks compared)")
    last_update: int = Field(description="the worker's last update, epoch seconds on its own clock")
    cpu_history: list[float] = Field(description="per-interval CPU %, oldest first; -1 marks a failed sample")
    cpu_ema: float | None = Field(description="the decider's moving average of cpu_history (None without CPU data)")
    metrics: dict[str, list[float]] = Field(description="every reported metric history (C, M, NI, NO, ...)")
    operating_range: dict[str, list[float]]
    throughput_kbps: float = Field(description="sum of the throughput of the leases it processes")
    lease_count: int = Field(description="leases it processes (the checkpoint owner during a handoff)")


class WorkersPage(BaseModel):
    """Every worker record."""

    items: list[WorkerOut]
    malformed: list[MalformedRow]
    repaired: list[MalformedRow] = Field(
        default_factory=list, description="listed workers whose stored values no consumer can use were ignored")


class LeaseOut(BaseModel):
    """One lease: who owns it, how far it got, what it carries."""

    lease_key: str
    stream: str | None
    shard_id: str
    owner: str | None = Field(description="leaseOwner (the next owner during a handoff)")
    checkpoint_owner: str | None = Field(description="set while a graceful handoff is in progress")
    state: LeaseState
    checkpoint: str
    lease_counter: int
    owner_switches_since_checkpoint: int
    throughput_kbps: float | None
    millis_behind_latest: Annotated[int | None, Field(
        description="MillisBehindLatest as the owner last reported it (null until it reports)")] = None
    records_behind: Annotated[int | None, Field(
        description="records waiting after the owner's position, where the owner knows it exactly (it read up to "
                    "the stream's tip); null when unknown")] = None
    read_throttled: Annotated[int | None, Field(
        description="the owner's read calls on the shard that Kinesis throttled in the last minute (the shard's read "
                    "limits are shared by every application reading it); null when the owner has no row")] = None
    read_stalled: Annotated[bool | None, Field(
        description="true while the owner reports that its reads of the shard made no progress for its red bound "
                    "(3 heartbeat intervals; decision 0039); null when the owner has no row")] = None
    shard_stalled: Annotated[bool | None, Field(
        description="true while the leader judges that the shard's reads stalled at two workers or more (the "
                    "shard's or the service's fault, not a worker's: its owner keeps it, decision 0043); null from a "
                    "replica that does not lead")] = None
    records_processed: Annotated[int | None, Field(
        description="records the current owner handled since it took the lease (null until it reports)")] = None
    bytes_processed: Annotated[int | None, Field(
        description="bytes of record data the current owner handled since it took the lease")] = None
    checkpoint_age_seconds: Annotated[float | None, Field(
        description="seconds since the checkpoint last moved, as of this answer: from the time its owner wrote it, "
                    "or for a checkpoint written without one (a KCL worker's) from the scanning replica's first look "
                    "at it")] = None
    checkpoint_moved_at: Annotated[float | None, Field(
        description="when the checkpoint took its current value (epoch seconds), by the rule above")] = None
    checkpoint_written_at: Annotated[float | None, Field(
        description="when the owner wrote the checkpoint (epoch seconds, the owner's clock); null for a checkpoint "
                    "written without it (KCL workers, agents before session 17)")] = None
    records_per_second: Annotated[float | None, Field(
        description="records the owner checkpointed per second over the last 30 s of its checkpoints (0 when the "
                    "checkpoint did not move in that time; null until 5 s of checkpoints are seen)")] = None
    failing_since: Annotated[float | None, Field(
        description="the owner is stuck on a batch its processor keeps failing: since when (wall seconds on the "
                    "owner); null while it is not")] = None
    failing_attempts: Annotated[int | None, Field(description="failed deliveries of that batch so far")] = None
    failing_error: Annotated[str | None, Field(description="the last error of that batch (shortened)")] = None
    poison_blocked_on: Annotated[str | None, Field(
        description="the poison record (SEQUENCE/SUB) the owner is blocked on (poison_policy block, or its quarantine "
                    "write failing); null while it is not")] = None
    quarantined_records: Annotated[int, Field(
        description="poison records the owner quarantined and checkpointed past since it took the lease")] = 0
    last_quarantined: Annotated[str | None, Field(
        description="the newest of them (SEQUENCE/SUB)")] = None
    last_quarantined_object: Annotated[str | None, Field(
        description="where the newest of them was written (its object's URL at poison_destination)")] = None
    paused: Annotated[str | None, Field(
        description="an operator's pause and its reason (shardherd pause); null while the shard runs")] = None
    paused_by: Annotated[str | None, Field(
        description="the worker that stopped processing for the pause (null until it did)")] = None
    parent_shard_ids: list[str]
    child_shard_ids: list[str]
    explanation: Annotated[list[Decision] | None, Field(
        description="with explain=true: what recent leader runs decided about this lease, newest first")] = None


class AssignmentsPage(BaseModel):
    """One page of leases, sorted by key."""

    items: list[LeaseOut]
    total: int = Field(description="leases matching the filters, over all pages")
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last page")
    malformed: list[MalformedRow]
    repaired: list[MalformedRow] = Field(
        default_factory=list, description="leases whose stored values no consumer can use were ignored (e.g. a "
                                          "negative throughputKBps); the leases are listed and assigned as usual")


class PoisonOut(BaseModel):
    """One shard with poison records: the record it is blocked on, or the records its owner quarantined."""

    lease_key: str
    shard_id: str
    owner: str | None = Field(description="the worker processing the shard (the checkpoint owner during a handoff)")
    blocked_on: str | None = Field(description="the poison record (SEQUENCE/SUB) the shard is blocked on, if any")
    blocked_since: float | None = Field(description="since when its batch fails (wall seconds on the owner)")
    error: str | None = Field(description="the record's last error (shortened)")
    quarantined: int = Field(description="records the owner quarantined since it took the lease")
    last_quarantined: str | None = Field(description="the newest of them (SEQUENCE/SUB)")
    last_object: str | None = Field(description="where the newest of them was written")


class PoisonPage(BaseModel):
    """Every shard with a poison record now (blocked on one, or having quarantined some), by lease key."""

    items: list[PoisonOut]


class LockOut(BaseModel):
    """The leader lock item as stored."""

    owner: str | None
    epoch: int | None
    released: bool
    lease_duration_millis: int | None


class LeaderOut(BaseModel):
    """The current leader, its freshness, and what it last published."""

    replica_id: str
    replica_is_leader: bool
    lock: LockOut
    last_success_age_seconds: float | None = Field(
        description="now (this replica's wall clock) minus the start of the leader's last successful run")
    stale: bool = Field(description="true when the last successful run is older than the readiness limit")
    status: LeaderStatus | None
    status_error: Annotated[str | None, Field(description="why the published status could not be read")] = None
    rewinds: list[dict[str, Any]] = Field(
        default_factory=list, description="the last rewinds, newest first (GET /v1/rewinds; none for anonymous "
                                           "callers): who, when, every shard's checkpoint before and after")


class DrainOut(BaseModel):
    """The drain flag after the request."""

    worker_id: str
    drain_requested: bool


class RestartOut(BaseModel):
    """A worker's restart reservation after the request (shared/restart.py)."""

    worker_id: str
    restart_within_ms: int | None = Field(description="how long the worker may stay silent and keep its leases; "
                                                       "None once cleared")


class MoveRecord(BaseModel):
    """One move of a run: which lease went from whom to whom, and why."""

    lease_key: str
    from_owner: str | None
    to_worker: str
    reason: str
    detail: str

    @classmethod
    def of(cls, move: Move) -> MoveRecord:
        """The record of a decider move (detail shortened)."""
        return cls(lease_key=move.lease_key, from_owner=move.from_owner, to_worker=move.to_worker,
                   reason=move.reason.value, detail=move.detail[:MAX_DETAIL_CHARS])


class UnplacedRecord(BaseModel):
    """A lease the decider wanted to place but could not, and why."""

    lease_key: str
    owner: str | None
    reason: str
    detail: str

    @classmethod
    def of(cls, unplaced: Unplaced) -> UnplacedRecord:
        """The record of a spillover or held lease (detail shortened)."""
        return cls(lease_key=unplaced.lease_key, owner=unplaced.owner, reason=unplaced.reason.value,
                   detail=unplaced.detail[:MAX_DETAIL_CHARS])


class WorkerPlanOut(BaseModel):
    """One worker before and after a planned run."""

    worker_id: str
    status: str
    leases_before: int
    leases_after: int
    throughput_before: float
    throughput_after: float
    metrics_before: dict[str, float]
    metrics_after: dict[str, float]
    note: str


class PlanOut(BaseModel):
    """What the decider would do now (nothing is written)."""

    strategy: str
    balanced: bool
    replica_is_leader: bool
    moves: list[MoveRecord]
    spillover: list[UnplacedRecord]
    held: list[UnplacedRecord]
    workers: list[WorkerPlanOut]
    averages: dict[str, float]
    notes: list[str]


class HealthOut(BaseModel):
    """A probe answer."""

    status: Literal["ok", "unavailable"]
    detail: str


class ScaleOut(BaseModel):
    """The leader's desired-worker count, in the shape KEDA's metrics-api scaler reads (`valueLocation`)."""

    desired_workers: int = Field(description="workers the fleet needs for its load at the target utilisation, "
                                 "with hysteresis (coordinator/scale_model.py)")
    current_workers: int = Field(description="workers the leader counted (live, not draining)")
    remove_first: str | None = Field(description="the worker whose leases move cheapest: drain it first on scale-in")
    reasons: list[str]
    load_kbps: float = Field(description="the throughput of every open lease, KiB/s")
    capacity_kbps: float | None = Field(description="KiB/s one worker carries at the target (median of the workers' "
                                        "own estimates); null when no worker's reports tell")
    computed_at: float = Field(description="wall-clock start of the leader run that computed the published figure")
    epoch: int = Field(description="the epoch of the leader that published it")
