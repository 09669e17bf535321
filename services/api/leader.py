"""GET /v1/leader: who leads, in which epoch, how fresh its last successful run is, and its recent runs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from shardherd.coordinator.leader_lock import LockView
from shardherd.services.api.auth import AUTH_RESPONSES, Access, access_of, require_read_token
from shardherd.services.api.context import ApiContext, context
from shardherd.services.api.controls import recent_rewinds
from shardherd.services.api.models import LeaderOut, LockOut
from shardherd.services.leader_status import LeaderStatus

router = APIRouter(prefix="/v1", tags=["leader"], dependencies=[Depends(require_read_token)])


def last_success_at(status: LeaderStatus | None, view: LockView, own: float | None = None) -> float | None:
    """The newest successful run's wall-clock start: from the lock heartbeat, or the status if that is newer.

    The status is written only when a run changes something; the lock's heartbeat carries the time of every run. On
    the leader replica `own` (its own newest run, in memory) is newer still: the heartbeat lags up to a heartbeat
    period and the snapshot up to its cache age (issue 33: the dashboard showed up to 8.9 s, 4.4 intervals).
    """
    times = [t for t in (view.last_success_at, status.last_success_at if status else None, own) if t is not None]
    return max(times, default=None)


@router.get("/leader", response_model=LeaderOut, responses=AUTH_RESPONSES,
            summary="The current leader, its epoch, the age of its last successful run, and its last runs")
def get_leader(request: Request, ctx: Annotated[ApiContext, Depends(context)]) -> LeaderOut:
    """The lock item and the leader's published status, as this replica read them last (see SnapshotCache)."""
    snapshot = ctx.snapshot(access_of(request), fresh=True)
    view, status, problem = snapshot.lock, snapshot.status, snapshot.status_problem
    newest = last_success_at(status, view, ctx.watch.last_success_wall() if ctx.lock.is_leader() else None)
    age = None if newest is None else round(max(0.0, ctx.clock.time() - newest), 3)
    limit = ctx.stall_limit_seconds + ctx.snapshots.max_age  # the snapshot itself may be that old
    stale = view.owner is not None and not view.released and (age is None or age > limit)
    return LeaderOut(
        replica_id=ctx.settings.worker_id, replica_is_leader=ctx.lock.is_leader(),
        lock=LockOut(owner=view.owner, epoch=view.epoch, released=view.released,
                     lease_duration_millis=view.lease_duration_millis),
        last_success_age_seconds=age, stale=stale, status=status, status_error=problem,
        rewinds=recent_rewinds(ctx) if access_of(request) is not Access.ANONYMOUS else [],
    )
