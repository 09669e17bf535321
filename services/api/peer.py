"""What one coordinator replica serves the others: the leader's hold on the lock and its API snapshot.

A replica that does not lead used to read the lock item every heartbeat period to watch for a takeover, and to scan
both tables for its own API snapshot: 40 of the 70 read units a minute the live stack paid at 8 shards. Now it asks
the leader replica instead (docs/decisions/0012-standby-reads.md): `GET /v1/lock` says whether this replica leads and
the version of its last heartbeat; `GET /v1/snapshot` is the snapshot the leader's own API serves (its run's scans, its
own lock and published status), answered from memory. A replica that does not lead answers both without the version
or with 409, so a follower never serves another follower's view.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, status
from pydantic import BaseModel, Field

from shardherd.coordinator.leader_lock import LockView
from shardherd.services.api.auth import AUTH_RESPONSES, Access, access_of, require_read_token
from shardherd.services.api.context import ApiContext, context
from shardherd.services.api.fleet import Fleet
from shardherd.services.api.models import ErrorBody
from shardherd.services.api.snapshot import ApiSnapshot
from shardherd.services.leader_status import LeaderStatus

router = APIRouter(prefix="/v1", tags=["replicas"], dependencies=[Depends(require_read_token)])


class HoldOut(BaseModel):
    """A replica's hold on the leader lock, from its memory."""

    replica_id: str
    leading: bool
    version: Annotated[str | None, Field(description="recordVersionNumber of its last successful heartbeat")] = None


class SnapshotOut(BaseModel):
    """The leader replica's API snapshot: its judged fleet, its lock item and its published status."""

    replica_id: str
    fleet: Fleet
    lock: LockView
    status: LeaderStatus | None
    status_problem: str | None
    age_seconds: float = Field(0.0, description="how old its tables were when it was sent")

    @classmethod
    def of(cls, replica_id: str, snapshot: ApiSnapshot) -> SnapshotOut:
        """The wire form of a snapshot."""
        return cls(replica_id=replica_id, fleet=snapshot.fleet, lock=snapshot.lock, status=snapshot.status,
                   status_problem=snapshot.status_problem, age_seconds=snapshot.age)

    def snapshot(self) -> ApiSnapshot:
        """Back to the form the API's handlers serve (a replica caches it by the age of its tables)."""
        return ApiSnapshot(self.fleet, self.lock, self.status, self.status_problem, self.age_seconds)


@router.get("/lock", response_model=HoldOut, responses=AUTH_RESPONSES,
            summary="Whether this replica leads, and the lock version of its last heartbeat (for other replicas)")
def get_hold(ctx: Annotated[ApiContext, Depends(context)]) -> HoldOut:
    """From this replica's memory: no store read."""
    report = ctx.lock.holder_report()
    return HoldOut(replica_id=report.replica_id, leading=report.leading, version=report.version)


@router.get("/snapshot", response_model=SnapshotOut,
            responses={409: {"model": ErrorBody, "description": "this replica does not lead"}, **AUTH_RESPONSES},
            summary="The leader replica's API snapshot (fleet, lock, status), which other replicas serve")
def get_snapshot(ctx: Annotated[ApiContext, Depends(context)], request: Request, fresh: bool = False) -> SnapshotOut:
    """The leader's snapshot; 409 on a replica that does not lead (it would only pass on a copy or scan).

    Built from the leader's own view, never from a store read: another replica asks on behalf of its own callers,
    anonymous ones included. With `fresh` (asked for a caller with a token) from a caller with a token itself, as
    this replica serves its own such callers: at most `api_cache_millis` old (issue 33).
    """
    if not ctx.lock.is_leader():
        raise HTTPException(status.HTTP_409_CONFLICT, f"replica {ctx.settings.worker_id} does not lead")
    served = ctx.snapshot(access_of(request), fresh=True) if fresh else ctx.snapshot(Access.ANONYMOUS)
    return SnapshotOut.of(ctx.settings.worker_id, served)
