"""GET /v1/workers and POST /v1/workers/{id}/drain|undrain (the operator's drain flag, e.g. from a preStop hook)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Request, status

from shardherd.coordinator.assignment_feed import NEWS
from shardherd.services.api.auth import AUTH_RESPONSES, access_of, require_read_token, require_token
from shardherd.services.api.context import ApiContext, context
from shardherd.services.api.models import DrainOut, ErrorBody, WorkersPage

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
    if not ctx.store.set_drain_requested(worker_id, requested):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no worker {worker_id!r} has a record")
    ctx.loop.feed.signal(worker_id, NEWS)
    return DrainOut(worker_id=worker_id, drain_requested=requested)


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
