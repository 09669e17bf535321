"""The operator REST API, health and metrics endpoints, and the dashboard, served by every coordinator replica."""

from shardherd.services.api.app import create_app
from shardherd.services.api.context import ApiContext
from shardherd.services.api.server import ApiServer

__all__ = ["ApiContext", "ApiServer", "create_app"]
