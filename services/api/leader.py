"""GET /v1/leader: who leads, in which epoch, how fresh its last successful run is, and its recent runs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from services.api.auth import AUTH_RESPONSES, require_read_token
from services.api.context import ApiContext, context
from services.api.models import LeaderOut, LockOut
from services.leader_status import LeaderStatus, MalformedLeaderStatus, read_status

router = APIRouter(prefix="/v1", tags=["leader"], dependencies=[Depends(require_read_token)])


def published_status(ctx: ApiContext) -> tuple[LeaderStatus | None, str | None]:
    """The leader's published status, or None and the reason it cannot be read."""
    try:
        return read_status(ctx.store), None
    except MalformedLeaderStatus as exc:
        return None, str(exc)


@router.get("/leader", response_model=LeaderOut, responses=AUTH_RESPONSES,
            summary="The current leader, its epoch, the age of its last successful run, and its last runs")
def get_leader(ctx: Annotated[ApiContext, Depends(context)]) -> LeaderOut:
    """The lock item and the leader's published status, as read from the store by this replica."""
    view = ctx.lock.read()
    status, problem = published_status(ctx)
    age = None
    if status is not None and status.last_success_at is not None:
        age = round(max(0.0, ctx.clock.time() - status.last_success_at), 3)
    stale = view.owner is not None and not view.released and (age is None or age > ctx.stall_limit_seconds)
    return LeaderOut(
        replica_id=ctx.settings.worker_id, replica_is_leader=ctx.lock.is_leader(),
        lock=LockOut(owner=view.owner, epoch=view.epoch, released=view.released,
                     lease_duration_millis=view.lease_duration_millis),
        last_success_age_seconds=age, stale=stale, status=status, status_error=problem,
    )
