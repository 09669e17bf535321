"""/healthz (every critical thread makes progress) and /readyz (the store answers; the leader's runs succeed)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from shardherd.coordinator.leader_lock import STORE_CHECK_SECONDS
from shardherd.services.api.context import ApiContext, context
from shardherd.services.api.models import HealthOut
from shardherd.shared.errors import ShardherdError

router = APIRouter(tags=["health"])

_UNAVAILABLE: dict[int | str, dict[str, object]] = {503: {"model": HealthOut, "description": "not ready"}}


@router.get("/healthz", response_model=HealthOut, responses=_UNAVAILABLE,
            summary="Liveness: the lock keeper and the leader loop each completed an iteration lately")
def healthz(ctx: Annotated[ApiContext, Depends(context)]) -> HealthOut | JSONResponse:
    """503 once a critical thread failed or has not completed an iteration within its bound (decision 0022).

    The replica then releases the lock and exits on its own; the probe catches what the process cannot (a wedged
    interpreter). Store trouble alone never fails it: that is readiness.
    """
    problem = None if ctx.supervisor is None else ctx.supervisor.problem()
    if problem is not None:
        return _unavailable(problem)
    return HealthOut(status="ok", detail="alive, every critical thread making progress")


@router.get("/readyz", response_model=HealthOut, responses=_UNAVAILABLE,
            summary="Readiness: the store is reachable and, on the leader, runs and shard syncs succeed")
def readyz(ctx: Annotated[ApiContext, Depends(context)]) -> HealthOut | JSONResponse:
    """503 if the store does not answer, or if this replica leads and has gone k intervals without a successful run.

    The store counts as answering when the leader lock's own calls succeeded lately (every heartbeat period on the
    leader, every 30 s on a replica that hears from the leader), else after one eventually consistent read.

    Also 503 on a leader whose shard sync has been failing that long (it still assigns leases; see /v1/leader).
    """
    try:  # the lock's own store calls are the evidence; a read only without recent evidence (decision 0012)
        ctx.lock.check_store(STORE_CHECK_SECONDS + 2 * ctx.settings.leader_lock_heartbeat_period_millis / 1000)
    except ShardherdError as exc:
        return _unavailable(f"store unreachable: {exc}")
    stalled = ctx.watch.seconds_without_progress()
    if stalled is not None and stalled > ctx.stall_limit_seconds:
        return _unavailable(f"leader without a successful run for {stalled:.1f} s "
                            f"(limit {ctx.stall_limit_seconds:.1f} s = {ctx.stall_intervals} intervals)")
    failing = ctx.watch.shard_sync_failing()
    if failing is not None and failing[0] > ctx.stall_limit_seconds:
        return _unavailable(f"shard sync failing for {failing[0]:.1f} s (limit {ctx.stall_limit_seconds:.1f} s; "
                            f"leases are still assigned): {failing[1]}")
    role = "leader" if stalled is not None else "follower"
    return HealthOut(status="ok", detail=f"store reachable ({role})")


def _unavailable(detail: str) -> JSONResponse:
    return JSONResponse(HealthOut(status="unavailable", detail=detail).model_dump(), status_code=503)
