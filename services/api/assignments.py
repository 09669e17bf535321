"""GET /v1/assignments: every lease with owner, state and throughput; filters, pagination and `explain`.

GET /v1/poison: the leases with poison records now (decision 0031), from the same snapshot: each owner's worker row
reports, per lease, the record it is blocked on and the records it quarantined (the newest by position and object).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response, status
from pydantic_core import to_json

from shardherd.services.api.auth import AUTH_RESPONSES, access_of, require_read_token
from shardherd.services.api.context import ApiContext, context
from shardherd.services.api.fleet import Fleet
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
async def list_assignments(
    request: Request,
    ctx: Annotated[ApiContext, Depends(context)],
    worker: Annotated[str | None, Query(description="only leases this worker processes or will process")] = None,
    stream: Annotated[str | None, Query(description="only leases of this stream")] = None,
    state: Annotated[LeaseState | None, Query(description="only leases in this state")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="page size")] = 100,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
    explain_: Annotated[bool, Query(alias="explain", description="add what recent leader runs decided")] = False,
) -> AssignmentsPage | Response:
    """One page of leases sorted by key; filters apply before pagination.

    On the event loop (nothing here blocks: `ctx.served` hands a snapshot that needs a fetch to a worker thread).
    The page as JSON is rendered once per fleet and query (services/api/rendered.py); each answer adds only its own
    fields, `checkpoint_age_seconds` (as of this answer) and `shard_stalled` (the leader's latest run).
    """
    query = PageQuery(worker, stream, state, limit, decode_cursor(cursor) if cursor is not None else None)
    snapshot = await ctx.served(access_of(request), fresh=True)
    fleet = snapshot.fleet
    now = ctx.clock.time()  # the snapshot may be seconds old: ages as of this answer, from when the moves were seen
    stalls = ctx.loop.feed.shard_stalls if ctx.lock.is_leader() else None  # decision 0043: the leader's alone
    if explain_:
        return _explained(snapshot, query, now, stalls)
    rendered = ctx.rendered.get(fleet, query, lambda: RenderedPage.of(fleet, query))
    return Response(rendered.body(now, stalls), media_type="application/json")


@dataclass(frozen=True, slots=True)
class PageQuery:
    """A page's filters (None: no filter), size and the key after which it starts."""

    worker: str | None
    stream: str | None
    state: LeaseState | None
    limit: int
    after: str | None

    def select(self, fleet: Fleet) -> tuple[list[LeaseOut], int, str | None]:
        """The page's leases, how many match the filters over all pages, and the next page's cursor."""
        matching = [lease for lease in fleet.leases if _wanted(lease, self.worker, self.stream, self.state)]
        remaining = [lease for lease in matching if self.after is None or lease.lease_key > self.after]
        page = remaining[:self.limit]
        return page, len(matching), encode_cursor(page[-1].lease_key) if len(remaining) > self.limit else None


def _live(lease: LeaseOut, now: float, stalls: frozenset[str] | None) -> dict[str, float | bool | None]:
    """A lease's per-answer fields: its checkpoint's age as of `now`, and whether the leader finds its shard stalled."""
    moved = lease.checkpoint_moved_at
    return {"checkpoint_age_seconds": None if moved is None else round(max(0.0, now - moved), 3),
            "shard_stalled": None if stalls is None else lease.lease_key in stalls}


@dataclass(frozen=True, slots=True)
class RenderedPage:
    """A page's JSON without its per-answer fields: the page around its items, each item around those two fields.

    `body` fills them in; the bytes are those of the AssignmentsPage with them set (pydantic's JSON, as FastAPI
    renders a response model): each item is rendered with both null and cut at them. A key with its quotes occurs
    once per item, as a key: inside a string value a quote is always escaped.
    """

    head: bytes
    items: tuple[tuple[LeaseOut, bytes, bytes, bytes], ...]  # lease, up to each field's value, then the rest
    tail: bytes

    @classmethod
    def of(cls, fleet: Fleet, query: PageQuery) -> RenderedPage:
        """The page `query` selects from `fleet`, rendered."""
        page, total, next_cursor = query.select(fleet)
        shell = AssignmentsPage(items=[], total=total, next_cursor=next_cursor, malformed=fleet.malformed_leases,
                                repaired=fleet.repaired_leases).model_dump_json().encode()
        empty = b'{"items":[]'
        assert shell.startswith(empty), shell[:40]
        return cls(empty[:-1], tuple(_cut(lease) for lease in page), shell[len(empty) - 1:])

    def body(self, now: float, stalls: frozenset[str] | None) -> bytes:
        """The page's JSON with each item's per-answer fields as of `now`."""
        items = []
        for lease, to_stalled, to_age, rest in self.items:
            live = _live(lease, now, stalls)
            items.append(b"".join((to_stalled, to_json(live["shard_stalled"]), to_age,
                                   to_json(live["checkpoint_age_seconds"]), rest)))
        return b"".join((self.head, b",".join(items), self.tail))


_STALLED = b'"shard_stalled":'
_AGE = b'"checkpoint_age_seconds":'


def _cut(lease: LeaseOut) -> tuple[LeaseOut, bytes, bytes, bytes]:
    """The lease's JSON cut after each per-answer field's key (their values dropped)."""
    rendered = lease.model_copy(update={"shard_stalled": None, "checkpoint_age_seconds": None}).model_dump_json()
    before, _, after = rendered.encode().partition(_STALLED + b"null")
    middle, _, rest = after.partition(_AGE + b"null")
    return lease, before + _STALLED, middle + _AGE, rest


def _wanted(lease: LeaseOut, worker: str | None, stream: str | None, state: LeaseState | None) -> bool:
    """Whether the lease passes the filters given (None: no filter)."""
    return ((worker is None or worker in (lease.owner, lease.checkpoint_owner))
            and (stream is None or lease.stream == stream) and (state is None or lease.state == state))


def _explained(snapshot: ApiSnapshot, query: PageQuery, now: float, stalls: frozenset[str] | None,
               ) -> AssignmentsPage:
    """The page with what recent leader runs decided about each lease, from the snapshot's status (no store read)."""
    page, total, next_cursor = query.select(snapshot.fleet)
    if page and snapshot.status_problem is not None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"cannot explain: {snapshot.status_problem}")
    reasons = explain(snapshot.status, (lease.lease_key for lease in page)) if page else {}
    items = [lease.model_copy(update={**_live(lease, now, stalls), "explanation": reasons.get(lease.lease_key, [])})
             for lease in page]
    return AssignmentsPage(items=items, total=total, next_cursor=next_cursor, malformed=snapshot.fleet.malformed_leases,
                           repaired=snapshot.fleet.repaired_leases)


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
