"""GET /v1/scale: the leader's desired-worker count for autoscalers (KEDA's metrics-api scaler, an external metric).

Every replica serves the figure the leader published with its status (services/leader_status.py), so an autoscaler
may ask any replica; the leader computes it in its full runs from what they read anyway (coordinator/scale_model.py).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, status

from shardherd.services.api.auth import AUTH_RESPONSES, access_of, require_read_token
from shardherd.services.api.context import ApiContext, context
from shardherd.services.api.models import ErrorBody, ScaleOut

router = APIRouter(prefix="/v1", tags=["scale"], dependencies=[Depends(require_read_token)])


@router.get("/scale", response_model=ScaleOut,
            responses={503: {"model": ErrorBody, "description": "no leader has published a count yet"},
                       **AUTH_RESPONSES},
            summary="Workers the fleet needs now (desired_workers) and the one to remove first")
def get_scale(request: Request, ctx: Annotated[ApiContext, Depends(context)]) -> ScaleOut:
    """The published figure; 503 (with Retry-After) before a leader published one."""
    published = ctx.snapshot(access_of(request)).status
    figure = None if published is None else published.scale
    if published is None or figure is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "no leader has published a desired-worker count yet",
                            headers={"Retry-After": "5"})
    return ScaleOut(desired_workers=figure.desired, current_workers=figure.current, remove_first=figure.remove_first,
                    reasons=list(figure.reasons), load_kbps=figure.load_kbps, capacity_kbps=figure.capacity_kbps,
                    computed_at=figure.computed_at, epoch=published.epoch)
