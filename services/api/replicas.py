"""GET /v1/replicas: every coordinator replica as it last reported itself, with its API URL and last error."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from shardherd.services.api.auth import AUTH_RESPONSES, access_of, require_read_token
from shardherd.services.api.context import ApiContext, context
from shardherd.services.replicas import KEEPALIVE_SECONDS, MalformedReplicas, ReplicaEntry, read_replicas

router = APIRouter(prefix="/v1", tags=["replicas"], dependencies=[Depends(require_read_token)])

# A replica that missed this many reports is shown as silent (it may be gone; entries age out after 5 minutes).
SILENT_REPORTS = 3


class ReplicaOut(ReplicaEntry):
    """A replica's report, judged by the replica answering."""

    report_age_seconds: float = Field(description="this replica's wall clock minus the report time")
    silent: bool = Field(description=f"no report for {SILENT_REPORTS} keep-alive periods "
                                     f"({KEEPALIVE_SECONDS:.0f} s each)")


class ReplicasPage(BaseModel):
    """Every replica that reported in the last minutes, sorted by id."""

    items: list[ReplicaOut]
    error: Annotated[str | None, Field(description="why the stored list could not be read")] = None


@router.get("/replicas", response_model=ReplicasPage, responses=AUTH_RESPONSES,
            summary="Every coordinator replica: API URL, leading or following, last report, last error")
def list_replicas(request: Request, ctx: Annotated[ApiContext, Depends(context)]) -> ReplicasPage:
    """The replica list every replica keeps fresh in the coordinator-state table.

    A replica counts as leading only while it holds the lock: a leader killed before it could report otherwise keeps
    its last report (`leading`) until its entry ages out.
    """
    try:
        entries, _ = read_replicas(ctx.store)
    except MalformedReplicas as exc:
        return ReplicasPage(items=[], error=str(exc))
    now, holder = ctx.clock.time(), ctx.snapshot(access_of(request)).lock.owner
    return ReplicasPage(items=[
        ReplicaOut(**entry.model_dump(exclude={"leading"}), leading=entry.leading and entry.replica_id == holder,
                   report_age_seconds=round(max(0.0, now - entry.reported_at), 3),
                   silent=now - entry.reported_at > SILENT_REPORTS * KEEPALIVE_SECONDS) for entry in entries])
