"""GET /v1/assignments: every lease with owner, state and throughput; filters, pagination and `explain`.

GET /v1/poison: the leases with poison records now (decision 0031), from the same snapshot: each owner's worker row
reports, per lease, the record it is blocked on and the records it quarantined (the newest by position and object).
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status

from shardherd.services.api.auth import AUTH_RESPONSES, access_of, require_read_token
from shardherd.services.api.context import ApiContext, context
from shardherd.services.api.models import AssignmentsPage, ErrorBody, LeaseOut, LeaseState, PoisonOut, PoisonPage
from shardherd.services.api.snapshot import ApiSnapshot
from shardherd.services.leader_status import explain

router = APIRouter(prefix="/v1", tags=["assignments"], dependencies=[Depends(require_read_token)])


def encode_cursor(lease_key: str) -> str:
    """An opaque cursor: the last key of a page, URL-safe base64."""
    return base64.urlsafe_b64encode(lease_key.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The lease key in a cursor; 400 if it is not one this API made."""
    try:
        key = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        key = None
    if not key or encode_cursor(key) != cursor:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"cursor {cursor!r} is not a cursor from this API")
    return key


@router.get("/assignments", response_model=AssignmentsPage,
            responses={400: {"model": ErrorBody, "description": "bad cursor"}, **AUTH_RESPONSES},
            summary="Every lease with its owner, checkpoint owner, checkpoint, state and throughput")
def list_assignments(
    request: Request,
    ctx: Annotated[ApiContext, Depends(context)],
    worker: Annotated[str | None, Query(description="only leases this worker processes or will process")] = None,
    stream: Annotated[str | None, Query(description="only leases of this stream")] = None,
    state: Annotated[LeaseState | None, Query(description="only leases in this state")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="page size")] = 100,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
    explain_: Annotated[bool, Query(alias="explain", description="add what recent leader runs decided")] = False,
) -> AssignmentsPage:
    """One page of leases sorted by key; filters apply before pagination."""
    after = decode_cursor(cursor) if cursor is not None else None
    snapshot = ctx.snapshot(access_of(request), fresh=True)
    fleet = snapshot.fleet
    matching = [lease for lease in fleet.leases if _wanted(lease, worker, stream, state)]
    remaining = [lease for lease in matching if after is None or lease.lease_key > after]
    now = ctx.clock.time()  # the snapshot may be seconds old: ages as of this answer, from when the moves were seen
    stalls = ctx.loop.feed.shard_stalls if ctx.lock.is_leader() else None  # decision 0043: the leader's alone
    page = [lease.model_copy(update={
        "checkpoint_age_seconds": None if lease.checkpoint_moved_at is None
        else round(max(0.0, now - lease.checkpoint_moved_at), 3),
        "shard_stalled": None if stalls is None else lease.lease_key in stalls}) for lease in remaining[:limit]]
    if explain_ and page:
        page = _explained(snapshot, page)
    next_cursor = encode_cursor(page[-1].lease_key) if len(remaining) > limit else None
    return AssignmentsPage(items=page, total=len(matching), next_cursor=next_cursor, malformed=fleet.malformed_leases,
                           repaired=fleet.repaired_leases)


def _wanted(lease: LeaseOut, worker: str | None, stream: str | None, state: LeaseState | None) -> bool:
    """Whether the lease passes the filters given (None: no filter)."""
    return ((worker is None or worker in (lease.owner, lease.checkpoint_owner))
            and (stream is None or lease.stream == stream) and (state is None or lease.state == state))


def _explained(snapshot: ApiSnapshot, page: list[LeaseOut]) -> list[LeaseOut]:
    """The page with what recent leader runs decided about each lease, from the snapshot's status (no store read)."""
    if snapshot.status_problem is not None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"cannot explain: {snapshot.status_problem}")
    reasons = explain(snapshot.status, (lease.lease_key for lease in page))
    return [lease.model_copy(update={"explanation": reasons.get(lease.lease_key, [])}) for lease in page]


@router.get("/poison", response_model=PoisonPage, responses=AUTH_RESPONSES,
            summary="Shards blocked on a poison record, and shards whose owner quarantined some (decision 0031)")
def list_poison(request: Request, ctx: Annotated[ApiContext, Depends(context)]) -> PoisonPage:
    """Every unfinished lease whose owner reports a poison record now, sorted by key."""
    leases = ctx.snapshot(access_of(request), fresh=True).fleet.leases
    return PoisonPage(items=[PoisonOut(
        lease_key=lease.lease_key, shard_id=lease.shard_id, owner=lease.checkpoint_owner or lease.owner,
        blocked_on=lease.poison_blocked_on, blocked_since=lease.failing_since if lease.poison_blocked_on else None,
        error=lease.failing_error if lease.poison_blocked_on else None, quarantined=lease.quarantined_records,
        last_quarantined=lease.last_quarantined, last_object=lease.last_quarantined_object)
        for lease in leases if lease.poison_blocked_on or lease.quarantined_records])
