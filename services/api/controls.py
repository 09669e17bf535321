"""POST /v1/pause, /v1/resume and /v1/rewind (admin token), GET /v1/rewinds: the operator controls of issue 34.

Pause and resume write the lease rows (shared/pause.py) and tell this replica's leader loop to scan at once, so the
owners hear of it over the coordinator channel within a run. A rewind runs in the request (coordinator/rewind.py):
its answer is the record of what was done. Bad input is a 400 with a one-line reason and nothing written.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from pydantic import BaseModel

from shardherd.coordinator.assignment_feed import NEWS
from shardherd.coordinator.rewind import Rewinder, RewindFailed, RewindRequest, history
from shardherd.coordinator.rewind_positions import RewindRecord
from shardherd.coordinator.rewind_probe import ProbeFailed
from shardherd.services.api.auth import AUTH_RESPONSES, require_read_token, require_token
from shardherd.services.api.context import ApiContext, context
from shardherd.services.api.models import ErrorBody
from shardherd.shared.aws import make_client
from shardherd.shared.errors import StoreError, StoreUnavailable
from shardherd.shared.pause import BadControlRequest, pause_reason, select_leases

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["controls"])

_RESPONSES = {400: {"model": ErrorBody, "description": "bad request: nothing was written"},
              409: {"model": ErrorBody, "description": "the rewind could not complete (see the reason)"},
              **AUTH_RESPONSES}
Shards = Annotated[list[str], Query(description="lease keys or shard ids (repeat)")]
Streams = Annotated[list[str], Query(description="stream names of a multi-stream application (repeat)")]


class PausedLease(BaseModel):
    """One lease after a pause or resume."""

    lease_key: str
    owner: str | None
    paused: str | None


class PauseOut(BaseModel):
    """The leases a pause or resume changed."""

    leases: list[PausedLease]


def _set(ctx: ApiContext, shards: list[str], streams: list[str], reason: str | None) -> PauseOut:
    try:
        chosen = select_leases(ctx.store.scan_leases().leases, shards, streams)
    except BadControlRequest as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from None
    changed = []
    for lease in chosen:
        outcome = ctx.store.set_pause(lease.lease_key, reason)
        row = outcome.lease or lease
        if row.actual_owner is not None:
            ctx.loop.feed.signal(row.actual_owner, NEWS)
        changed.append(PausedLease(lease_key=row.lease_key, owner=row.actual_owner, paused=row.paused))
    return PauseOut(leases=changed)


@router.post("/pause", response_model=PauseOut, responses=_RESPONSES, dependencies=[Depends(require_token)],
             summary="Pause shards: each owner checkpoints what it delivered and stops reading; the lease stays its")
def pause(ctx: Annotated[ApiContext, Depends(context)], shard: Shards = [],  # noqa: B006 (FastAPI's query lists)
          stream: Streams = [], reason: str | None = None) -> PauseOut:  # noqa: B006
    """Pause the named shards (or every shard of the named streams) until resumed; survives every restart."""
    try:
        text = pause_reason(reason)
    except BadControlRequest as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from None
    return _set(ctx, shard, stream, text)


@router.post("/resume", response_model=PauseOut, responses=_RESPONSES, dependencies=[Depends(require_token)],
             summary="Resume paused shards from their checkpoints")
def resume(ctx: Annotated[ApiContext, Depends(context)], shard: Shards = [],  # noqa: B006
           stream: Streams = []) -> PauseOut:  # noqa: B006
    """Clear the pause of the named shards (or streams)."""
    return _set(ctx, shard, stream, None)


def _rewinder(request: Request, ctx: ApiContext) -> Rewinder:
    found: Rewinder | None = getattr(request.app.state, "rewinder", None)
    if found is None:
        kinesis = make_client("kinesis", ctx.settings.region, ctx.settings.kinesis_endpoint_url)
        found = Rewinder(ctx.store, kinesis, ctx.settings, ctx.clock, lambda worker: ctx.loop.feed.signal(worker, NEWS))
        request.app.state.rewinder = found
    return found


@router.post("/rewind", response_model=dict[str, Any], responses=_RESPONSES, dependencies=[Depends(require_token)],
             summary="Rewind (or fast-forward) shards to a time or sequence numbers, online and fenced")
def rewind(request: Request, ctx: Annotated[ApiContext, Depends(context)], to: str | None = None,
           to_sequence: Annotated[list[str], Query(description="SHARD=SEQUENCE (repeat)")] = [],  # noqa: B006
           shard: Shards = [], stream: Streams = [], dry_run: bool = False,  # noqa: B006
           who: str = "api") -> dict[str, Any]:
    """Pause the shards, rewrite their checkpoints once nobody processes them, resume; the record of it."""
    client = request.client.host if request.client else "?"
    asked = RewindRequest(who=f"{who} (from {client})", to=to, sequences=to_sequence, shards=shard, streams=stream,
                          dry_run=dry_run)
    try:
        record = _rewinder(request, ctx).run(asked)
    except BadControlRequest as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from None
    except (RewindFailed, ProbeFailed) as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    if not record.dry_run:
        try:
            _read_history(ctx)  # /v1/leader of this replica shows it at once (one read per rewind)
        except (StoreError, StoreUnavailable) as exc:  # the rewind is done and recorded; only this copy stays older
            log.warning("rewind %s done; its history not re-read for /v1/leader: %s", record.rewind_id, exc)
    return _plain(record)


@router.get("/rewinds", response_model=list[dict[str, Any]], responses=AUTH_RESPONSES,
            dependencies=[Depends(require_read_token)], summary="The last rewinds: who, when, every shard's change")
def rewinds(ctx: Annotated[ApiContext, Depends(context)]) -> list[dict[str, Any]]:
    """The kept rewind records, newest first (read from the coordinator-state table)."""
    return _read_history(ctx)


# What /v1/leader shows of the rewinds, per API context: the history as this replica last read it (after a rewind it
# ran, or on GET /v1/rewinds). /v1/leader is served from memory (decision 0012: polled by every dashboard, it reads
# nothing), so it never reads the table for them; GET /v1/rewinds always does.
_history_cache: dict[int, list[dict[str, Any]]] = {}


def _read_history(ctx: ApiContext) -> list[dict[str, Any]]:
    """The kept rewind records from the table, newest first; remembered for /v1/leader."""
    records = [_plain(record) for record in history(ctx.store)]
    _history_cache[id(ctx)] = records
    return records


def recent_rewinds(ctx: ApiContext) -> list[dict[str, Any]]:
    """The rewind records as this replica last read them (no store read: /v1/leader is served from memory)."""
    return _history_cache.get(id(ctx), [])


def _plain(record: RewindRecord) -> dict[str, Any]:
    plain: dict[str, Any] = json.loads(record.to_json())
    return plain
