"""A container credentials endpoint on 127.0.0.1 (what ECS and EKS Pod Identity serve) that can start failing.

A process started with AWS_CONTAINER_CREDENTIALS_FULL_URI pointing here (and no static keys) gets its credentials
through botocore's standard chain. Each answer expires EXPIRES_IN seconds ahead, inside botocore's mandatory refresh
window, so every AWS call refreshes first: once `failing` is set, the next call of every such process meets a
refresh failure (HTTP 500 from the endpoint), as when the credential source breaks while credentials run out.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.faulty_proxy import LoopbackServer

EXPIRES_IN = timedelta(minutes=5)  # botocore refreshes when less than 10 minutes are left


class CredentialsEndpoint(LoopbackServer):
    """Serves dummy temporary credentials until `failing` is set, then 500s."""

    def __init__(self) -> None:
        self.failing = False
        self.served = 0
        self.refused = 0
        super().__init__(self._handler_class())

    @property
    def url(self) -> str:
        """The AWS_CONTAINER_CREDENTIALS_FULL_URI value."""
        return f"http://127.0.0.1:{self.port}/credentials"

    def env(self) -> dict[str, str]:
        """Environment that makes a child process take its credentials from this endpoint only."""
        return {"AWS_CONTAINER_CREDENTIALS_FULL_URI": self.url, "AWS_ACCESS_KEY_ID": "",
                "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "", "AWS_CONFIG_FILE": "/nonexistent",
                "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}

    def _answer(self) -> tuple[int, bytes]:
        if self.failing:
            self.refused += 1
            return 500, b'{"message": "injected: credential source unavailable"}'
        self.served += 1
        expires = (datetime.now(UTC) + EXPIRES_IN).strftime("%Y-%m-%dT%H:%M:%SZ")
        return 200, json.dumps({"AccessKeyId": "test", "SecretAccessKey": "test", "Token": "test-session",
                                "Expiration": expires}).encode()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = endpoint._answer()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Keep output quiet."""

        return Handler
