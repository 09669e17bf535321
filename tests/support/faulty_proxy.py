"""An HTTP forwarder on 127.0.0.1 that answers scheduled requests with canned faults and proxies the rest.

It sits between a boto3 client and the moto server so the store's retry path meets real HTTP throttling replies,
5xx errors and dropped connections instead of a patched client.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

_JSON = "application/x-amz-json-1.0"
_TYPE_PREFIX = "com.amazonaws.dynamodb.v20120810#"


@dataclass(frozen=True)
class Fault:
    """One canned reply: an HTTP status with a DynamoDB JSON body, or (status 0) a connection closed unanswered.

    With `forward` the request still reaches the server first (applied there), and only the reply is replaced. `raw`
    replaces the JSON body with those bytes (a 200 whose body is not what the service sends, as a broken proxy does).
    `delay` seconds pass before the reply (a server slow to build its answer: a client's read deadline runs out).
    """

    status: int
    code: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    forward: bool = False
    raw: bytes | None = None
    delay: float = 0.0

    def body(self) -> bytes:
        """The JSON body the service would send (error type and message, plus any extra fields), or `raw`."""
        if self.raw is not None:
            return self.raw
        payload: dict[str, Any] = dict(self.extra)
        if self.code:
            payload.update({"__type": _TYPE_PREFIX + self.code, "message": f"injected {self.code}"})
        return json.dumps(payload).encode()


THROTTLED = Fault(400, "ProvisionedThroughputExceededException")
INTERNAL_ERROR = Fault(500, "InternalServerError")
DROPPED = Fault(0)
REPLY_LOST = Fault(0, forward=True)


class _QuietServer(ThreadingHTTPServer):
    """A client that hung up (a killed process, a timed-out call) is normal here: no traceback for it."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet about connections the client closed; report anything else as usual."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LoopbackServer:
    """An HTTP server on a free port of 127.0.0.1, served by a daemon thread while the context is open."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = _QuietServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return int(self._server.server_address[1])

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class FaultyProxy(LoopbackServer):
    """Serves the scheduled faults first (None entries forward), then forwards every request to `upstream`."""

    def __init__(self, upstream: str, schedule: Iterable[Fault | None] = ()) -> None:
        target = urlsplit(upstream)
        if target.hostname != "127.0.0.1":
            raise ValueError(f"the proxy only forwards to loopback, not {upstream}")
        self._upstream_port = target.port or 80
        self._schedule: deque[Fault | None] = deque(schedule)
        self._lock = threading.Lock()
        self.faults_served = 0
        self.forwarded: list[str] = []  # the X-Amz-Target of every request that reached the server, in order
        self.bodies: list[bytes] = []  # every request's body as received, in order
        self._received = 0
        super().__init__(self._handler_class())

    @property
    def endpoint_url(self) -> str:
        """Where to point the boto3 client."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> int:
        """Requests received so far."""
        with self._lock:
            return self._received

    def add(self, schedule: Iterable[Fault | None]) -> None:
        """Append more scheduled replies."""
        with self._lock:
            self._schedule.extend(schedule)

    def _next(self, target: str) -> Fault | None:
        with self._lock:
            self._received += 1
            fault = self._schedule.popleft() if self._schedule else None
            if fault is None or fault.forward:
                self.forwarded.append(target)
            if fault is not None:
                self.faults_served += 1
            return fault

    def _next_for(self, target: str, body: bytes) -> Fault | None:
        """The reply to a request with this body: `_next` (subclasses may look at the body first)."""
        return self._next(target)

    def _answered(self, target: str, body: bytes, payload: bytes) -> None:
        """A forwarded request's answer arrived (subclasses may learn from it)."""

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, list[Any], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self._upstream_port, timeout=30)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            connection.close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with proxy._lock:
                    proxy.bodies.append(body)
                target = self.headers.get("X-Amz-Target", "")
                fault = proxy._next_for(target, body)
                if fault is not None and fault.delay:
                    time.sleep(fault.delay)
                if fault is not None and fault.forward:
                    proxy._forward("POST", self.path, dict(self.headers), body)
                if fault is None:
                    status, headers, payload = proxy._forward("POST", self.path, dict(self.headers), body)
                    proxy._answered(target, body, payload)
                    self.send_response(status)
                    for name, value in headers:
                        if name.lower() not in ("content-length", "connection", "transfer-encoding", "date",
                                                "server"):
                            self.send_header(name, value)
                elif fault.status == 0:
                    self.close_connection = True
                    self.connection.close()
                    return
                else:
                    status, payload = fault.status, fault.body()
                    self.send_response(status)
                    self.send_header("Content-Type", _JSON)
                    self.send_header("x-amzn-RequestId", "faulty-proxy")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                """Keep test output quiet."""

        return Handler
