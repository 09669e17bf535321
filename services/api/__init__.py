"""The operator REST API, health and metrics endpoints, and the dashboard, served by every coordinator replica."""

from services.api.app import create_app
from services.api.context import ApiContext
from services.api.server import ApiServer

__all__ = ["ApiContext", "ApiServer", "create_app"]
