"""GET /v1/workers, POST /v1/workers/{id}/drain|undrain and POST|DELETE /v1/workers/{id}/restart.

Drain sets the operator's drain flag (e.g. from a preStop hook); restart a restart reservation (shared/restart.py).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, status

from shardherd.coordinator.assignment_feed import NEWS
from shardherd.services.api.auth import AUTH_RESPONSES, access_of, require_read_token, require_token
from shardherd.services.api.context import ApiContext, context
from shardherd.services.api.models import DrainOut, ErrorBody, RestartOut, WorkersPage
from shardherd.shared.restart import BadRestartWindow, parse_window

router = APIRouter(prefix="/v1", tags=["workers"])

WorkerId = Annotated[str, Path(min_length=1, max_length=256, description="the worker id as in its record")]


@router.get("/workers", response_model=WorkersPage, responses=AUTH_RESPONSES,
            dependencies=[Depends(require_read_token)],
            summary="Every worker with state, CPU history and EMA, throughput, lease count and heartbeat age")
def list_workers(request: Request, ctx: Annotated[ApiContext, Depends(context)]) -> WorkersPage:
    """Every worker record, judged on this replica's clock."""
    fleet = ctx.snapshot(access_of(request), fresh=True).fleet
    return WorkersPage(items=fleet.workers, malformed=fleet.malformed_workers, repaired=fleet.repaired_workers)


def _set_drain(ctx: ApiContext, worker_id: str, requested: bool) -> DrainOut:
    """Store the flag, then tell this replica's leader loop to scan at once (as an agent's drain news does).

    Otherwise the leader saw the flag only at its next full scan (`leader_full_scan_interval_millis`): 4-5 s before
    the first handoff of a drain in the local stack. A replica that does not lead leaves it to the leader's scans.
    """
    _stored(ctx, worker_id, ctx.store.set_drain_requested(worker_id, requested))
    return DrainOut(worker_id=worker_id, drain_requested=requested)


def _stored(ctx: ApiContext, worker_id: str, found: bool) -> None:
    """404 if the worker had no record to change; else wake this replica's leader loop (it looks at once)."""
    if not found:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no worker {worker_id!r} has a record")
    ctx.loop.feed.signal(worker_id, NEWS)


_MUTATING = {404: {"model": ErrorBody, "description": "no such worker"}, **AUTH_RESPONSES}


@router.post("/workers/{worker_id}/drain", response_model=DrainOut, responses=_MUTATING,
             dependencies=[Depends(require_token)],
             summary="Ask the leader to move every lease off this worker gracefully")
def drain(worker_id: WorkerId, ctx: Annotated[ApiContext, Depends(context)]) -> DrainOut:
    """Set the worker's drain flag; the leader moves its leases away within a run or two."""
    return _set_drain(ctx, worker_id, True)


@router.post("/workers/{worker_id}/undrain", response_model=DrainOut, responses=_MUTATING,
             dependencies=[Depends(require_token)], summary="Clear the drain flag")
def undrain(worker_id: WorkerId, ctx: Annotated[ApiContext, Depends(context)]) -> DrainOut:
    """Clear the worker's drain flag; it receives leases again."""
    return _set_drain(ctx, worker_id, False)


def _set_restart(ctx: ApiContext, worker_id: str, within_ms: int | None) -> RestartOut:
    """Store the reservation (or clear it) and wake this replica's leader loop, as a drain does."""
    _stored(ctx, worker_id, ctx.store.set_restart(worker_id, within_ms))
    return RestartOut(worker_id=worker_id, restart_within_ms=within_ms)


_RESTART = {400: {"model": ErrorBody, "description": "not a usable window: nothing was written"}, **_MUTATING}


@router.post("/workers/{worker_id}/restart", response_model=RestartOut, responses=_RESTART,
             dependencies=[Depends(require_token)],
             summary="Reserve the worker's leases for its restart: nobody else gets them within the window")
def restart(worker_id: WorkerId, ctx: Annotated[ApiContext, Depends(context)],
            within: Annotated[str, Query(max_length=32, description="e.g. 60s, 1500ms, 2m")] = "60s") -> RestartOut:
    """Set the reservation: the worker, when it stops, keeps its leases until it is back or silent that long."""
    try:
        within_ms = parse_window(within)
    except BadRestartWindow as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from None
    return _set_restart(ctx, worker_id, within_ms)


@router.delete("/workers/{worker_id}/restart", response_model=RestartOut, responses=_MUTATING,
               dependencies=[Depends(require_token)], summary="Clear the restart reservation")
def cancel_restart(worker_id: WorkerId, ctx: Annotated[ApiContext, Depends(context)]) -> RestartOut:
    """Clear the reservation: the worker drains (or fails over) as usual again."""
    return _set_restart(ctx, worker_id, None)
