"""POST /v1/plan: what the decider would do now, computed from the store; nothing is written."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from shardherd.services.api.auth import AUTH_RESPONSES, require_read_token
from shardherd.services.api.context import ApiContext, context
from shardherd.services.api.models import MoveRecord, PlanOut, UnplacedRecord, WorkerPlanOut

router = APIRouter(prefix="/v1", tags=["plan"], dependencies=[Depends(require_read_token)])


@router.post("/plan", response_model=PlanOut, responses=AUTH_RESPONSES,
             summary="Dry run of the decider on the current state (a balancing run); no writes")
def dry_run(ctx: Annotated[ApiContext, Depends(context)]) -> PlanOut:
    """The plan; on a replica that is not the leader every worker with a record counts as active."""
    plan = ctx.loop.dry_run()
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
