"""POST /v1/plan: what the decider would do now, computed from the store; nothing is written.

A dry run costs two full scans and a full decide, so it is not anonymous: it needs the read or the admin token, and
a replica makes at most one per `PlanCache.min_gap` seconds however many callers ask (they share the newest plan).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, status

from shardherd.services.api.auth import AUTH_RESPONSES, Access, access_of, require_read_token
from shardherd.services.api.context import ApiContext, context
from shardherd.services.api.models import MoveRecord, PlanOut, UnplacedRecord, WorkerPlanOut

router = APIRouter(prefix="/v1", tags=["plan"], dependencies=[Depends(require_read_token)])


@router.post("/plan", response_model=PlanOut, responses=AUTH_RESPONSES,
             summary="Dry run of the decider on the current state (a balancing run); no writes; needs a token")
def dry_run(request: Request, ctx: Annotated[ApiContext, Depends(context)]) -> PlanOut:
    """The plan; on a replica that is not the leader every worker with a record counts as active."""
    if access_of(request) is Access.ANONYMOUS:
        ctx.tokens.loud.refused(request, "a dry run needs the read or the admin token")
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "a dry run scans the store: send the read or the admin token",
                            headers={"WWW-Authenticate": "Bearer"})
    plan = ctx.plans.get()
    return PlanOut(
        strategy=plan.strategy, balanced=plan.balanced, replica_is_leader=ctx.lock.is_leader(),
        moves=[MoveRecord.of(move) for move in plan.moves],
        spillover=[UnplacedRecord.of(item) for item in plan.spillover],
        held=[UnplacedRecord.of(item) for item in plan.held],
        workers=[WorkerPlanOut(worker_id=w.worker_id, status=w.status.value, leases_before=w.leases_before,
                               leases_after=w.leases_after, throughput_before=w.throughput_before,
                               throughput_after=w.throughput_after, metrics_before=dict(w.metrics_before),
                               metrics_after=dict(w.metrics_after), note=w.note) for w in plan.workers],
        averages=dict(plan.averages), notes=list(plan.notes),
    )
