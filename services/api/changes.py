"""GET /v1/workers/{id}/assignments/changes: agents long-poll the leader replica for changes to their leases.

See coordinator/assignment_feed.py. Only the leader replica answers (409 elsewhere, so the agent asks again and a
Service may route it to the leader, or falls back to polling the store); the request waits up to `wait` seconds
for the worker's version to move past `after` in feed `feed`, and answers with the worker's leases as the leader
sees them. It costs no store read: the leader's own runs feed it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, status
from pydantic import BaseModel

from shardherd.coordinator.assignment_feed import NotLeading
from shardherd.services.api.auth import AUTH_RESPONSES, require_read_token
from shardherd.services.api.context import ApiContext, context
from shardherd.services.api.workers import WorkerId

router = APIRouter(prefix="/v1", tags=["agents"])

MAX_WAIT_SECONDS = 60.0


class AssignmentChanges(BaseModel):
    """A worker's leases as the leader sees them, with the feed position to wait from next."""

    feed: str
    version: int
    leases: dict[str, str]  # lease key -> owns | receives | hands_off


@router.get("/workers/{worker_id}/assignments/changes", response_model=AssignmentChanges,
            responses={409: {"description": "this replica does not lead"}, **AUTH_RESPONSES},
            dependencies=[Depends(require_read_token)],
            summary="Long-poll (agents): the worker's leases once they change, or after `wait` seconds")
async def assignment_changes(worker_id: WorkerId, ctx: Annotated[ApiContext, Depends(context)],
                             feed: Annotated[str | None, Query(max_length=64)] = None,
                             after: Annotated[int, Query(ge=0)] = 0,
                             wait: Annotated[float, Query(ge=0, le=MAX_WAIT_SECONDS)] = 20.0) -> AssignmentChanges:
    """Answer at once if the worker's position differs from (`feed`, `after`), else when it moves or `wait` ends."""
    try:
        position = await ctx.loop.feed.wait(worker_id, feed, after, wait)
    except NotLeading:
        raise HTTPException(status.HTTP_409_CONFLICT, "this replica does not lead") from None
    return AssignmentChanges(feed=position.feed, version=position.version, leases=position.leases)
