"""GET /v1/workers/{id}/assignments/changes: agents long-poll the leader replica for changes to their leases.

See coordinator/assignment_feed.py. Only the leader replica answers (409 elsewhere, so the agent asks again and a
Service may route it to the leader, or falls back to polling the store); the request waits up to `wait` seconds
for the worker's version to move past `after` in feed `feed`, and answers with the worker's leases as the leader
sees them. It costs no store read: the leader's own runs feed it.

The request is also the agent's presence on the channel (docs/decisions/0010-leader-scans.md): a client that goes
away while its request waits (a killed agent) is noticed at once and signalled to the leader, and `news=true` (an
agent that announced a drain, gave leases back or reached a shard's end) asks the leader to look at the store now.
`hb` and `lut` are the agent's last written worker row, as the leader's liveness sightings take them (the feed's
`report_beat`). `fleet_stalls` is the leader's verdict that most lease-holding workers stall at once
(coordinator/fleet_stall.py): agents then keep their stalled leases instead of giving them back. `shard_stalls` are
the worker's leases whose reads stalled at two workers or more (coordinator/shard_stall.py): it keeps those too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from pydantic import BaseModel

from shardherd.coordinator.assignment_feed import NEWS, NotLeading
from shardherd.services.api.auth import AUTH_RESPONSES, Access, access_of, require_read_token
from shardherd.services.api.context import ApiContext, context
from shardherd.services.api.workers import WorkerId
from shardherd.shared.assignment_channel import FeedPosition

router = APIRouter(prefix="/v1", tags=["agents"])

MAX_WAIT_SECONDS = 60.0


class AssignmentChanges(BaseModel):
    """A worker's leases as the leader sees them, with the feed position to wait from next."""

    feed: str
    version: int
    leases: dict[str, str]  # lease key -> owns | receives | hands_off
    fleet_stalls: bool = False  # most lease-holding workers stall at once: keep stalled leases (decision 0039)
    shard_stalls: list[str] = []  # the worker's leases stalled at two workers or more: keep them (decision 0043)


@router.get("/workers/{worker_id}/assignments/changes", response_model=AssignmentChanges,
            responses={409: {"description": "this replica does not lead"}, **AUTH_RESPONSES},
            dependencies=[Depends(require_read_token)],
            summary="Long-poll (agents): the worker's leases once they change, or after `wait` seconds")
async def assignment_changes(worker_id: WorkerId, request: Request, ctx: Annotated[ApiContext, Depends(context)],
                             feed: Annotated[str | None, Query(max_length=64)] = None,
                             after: Annotated[int, Query(ge=0)] = 0,
                             wait: Annotated[float, Query(ge=0, le=MAX_WAIT_SECONDS)] = 20.0,
                             news: bool = False,
                             hb: Annotated[int | None, Query(ge=0)] = None,
                             lut: Annotated[int | None, Query(ge=0)] = None) -> AssignmentChanges:
    """Answer at once if the worker's position differs from (`feed`, `after`), else when it moves or `wait` ends.

    Only a caller with a token is presence on the channel or a signal (news, a join, a dropped request): an
    anonymous one is answered and forgotten, so it can never make the leader scan (decision 0021).
    """
    listen = access_of(request) is not Access.ANONYMOUS
    if news and listen:
        ctx.loop.feed.signal(worker_id, NEWS)
    if hb is not None and lut is not None and listen:
        ctx.loop.feed.report_beat(worker_id, hb, lut)
    try:
        position = await _unless_gone(request, ctx.loop.feed.wait(worker_id, feed, after, wait, listen))
    except NotLeading:
        raise HTTPException(status.HTTP_409_CONFLICT, "this replica does not lead") from None
    return AssignmentChanges(feed=position.feed, version=position.version, leases=position.leases,
                             fleet_stalls=position.fleet_stalls, shard_stalls=sorted(position.shard_stalls))


async def _unless_gone(request: Request, waiting: Coroutine[Any, Any, FeedPosition]) -> FeedPosition:
    """Await `waiting`, cancelled as soon as the client closes its connection (the feed then counts it dropped)."""
    answer = asyncio.ensure_future(waiting)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not answer.done():
        answer.cancel()
        await asyncio.gather(answer, return_exceptions=True)
        raise HTTPException(499, "client closed the request")
    return answer.result()


async def _disconnected(request: Request) -> None:
    """Return once the client has closed the connection (the ASGI server's `http.disconnect`)."""
    while (await request.receive())["type"] != "http.disconnect":
        continue
