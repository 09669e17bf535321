"""The FastAPI application of one coordinator replica: /v1 routes, probes, metrics and the dashboard at `/`.

`/docs` is Swagger UI from the assets the `fastapi-offline` package ships (docs/decisions/0006-offline-docs.md):
it works without Internet access, unlike FastAPI's default page, which loads Swagger UI from a CDN.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from shardherd.services.api import (
    assignments,
    changes,
    controls,
    health,
    leader,
    metrics,
    peer,
    plan,
    replicas,
    scale,
    workers,
)
from shardherd.services.api.context import ApiContext
from shardherd.shared.errors import ShardherdError
from shardherd.shared.store_meter import acting_as

DASHBOARD = Path(__file__).parent / "dashboard"
API_VERSION = "1"
DOCS_ASSETS = "/docs-assets"
SWAGGER_UI = files("fastapi_offline") / "static"  # Swagger UI 5 (OpenAPI 3.1), no CDN


def create_app(ctx: ApiContext) -> FastAPI:
    """The app serving `ctx`; store trouble becomes 503 with a one-line reason, never a 500."""
    app = FastAPI(
        title="shardherd operator API", version=API_VERSION,
        description="Leases, workers, the leader and its decisions; drain and dry-run planning. Every coordinator "
                    "replica serves it; mutating endpoints need `Authorization: Bearer <token>`.",
        docs_url=None, redoc_url=None,
    )
    app.state.ctx = ctx
    for module in (assignments, workers, changes, leader, replicas, peer, plan, health, metrics, controls, scale):
        app.include_router(module.router)

    @app.exception_handler(ShardherdError)
    def _store_trouble(request: Request, exc: ShardherdError) -> JSONResponse:
        return JSONResponse({"detail": f"{type(exc).__name__}: {exc}"}, status_code=503)

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(DASHBOARD / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:  # browsers ask for it whatever the page links
        return FileResponse(DASHBOARD / "favicon.svg", media_type="image/svg+xml")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} (docs)",
                                   swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png")

    app.mount("/dashboard", StaticFiles(directory=DASHBOARD), name="dashboard")
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(SWAGGER_UI)), name="docs-assets")
    app.add_middleware(CallerTag)
    return app


class CallerTag:
    """ASGI middleware: store calls made for a request count under caller `metrics` (scrapes) or `api` (the rest).

    Only a metered store (shared/store_meter.py) looks at the caller; otherwise this costs a context switch of a
    context variable per request.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the request with the caller set."""
        with acting_as("metrics" if scope.get("path") == "/metrics" else "api"):
            await self.app(scope, receive, send)
