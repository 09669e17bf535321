"""HTTP GETs over the standard library's http.client, for an agent's coordinator channel and ECS metadata reads.

A plain agent already holds http.client (botocore's urllib3 is built on it); httpx added about 70 modules and 2.2 MB
of resident memory to each agent process (docs/decisions/0024-multilang-daemon.md, session 23). The coordinator, the
operator CLI and the MultiLang daemon keep httpx (shared/lean_httpx.py).

Invariants:
- Every request has a deadline: its timeout bounds the connect and each read of the socket.
- A client keeps one connection per host (keep-alive) and drops it after any failure; a GET that fails on a reused
  connection before any answer is sent once more on a new one (the server may have closed it while idle).
- `close()` may come from another thread: it shuts the sockets down, so a request waiting on one ends at once with
  `HttpError`, and every later request fails the same way.
- No redirect is followed and no proxy is taken from the environment; https verifies certificates with one context
  per process (certifi's CA bundle, as httpx's default), made at the first https request.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import TracebackType
from typing import Any
from urllib.parse import urlencode, urlsplit

__all__ = ["HttpClient", "HttpError", "Response", "tls_context"]

Params = Mapping[str, str | int | float]


class HttpError(Exception):
    """A request that got no answer: refused, reset, timed out, an unreadable reply, or a closed client."""


@dataclass(frozen=True, slots=True)
class Response:
    """An answer: its status and its body."""

    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        """The body as text (UTF-8, undecodable bytes replaced)."""
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON (ValueError if it is not)."""
        return json.loads(self.content)


@cache
def tls_context() -> ssl.SSLContext:
    """The process's one verifying TLS context: certifi's CA bundle, environment ignored (httpx's default)."""
    import certifi  # only a process that makes an https request needs it

    return ssl.create_default_context(cafile=certifi.where())


class HttpClient:
    """GETs with a default `timeout` (seconds); usable from one thread, closable from any."""

    def __init__(self, timeout: float = 5.0) -> None:
        self._timeout = timeout
        self._connections: dict[tuple[str, str], http.client.HTTPConnection] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def get(self, url: str, params: Params | None = None, headers: Mapping[str, str] | None = None,
            timeout: float | None = None) -> Response:
        """GET `url` with `params` as its query; HttpError when no answer came within `timeout`."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpError(f"not an http(s) URL: {url!r}")
        target = parts.path or "/"
        query = "&".join(filter(None, [parts.query, urlencode(params or {})]))
        target += f"?{query}" if query else ""
        key = (parts.scheme, parts.netloc)
        for attempt in range(2):
            connection, reused = self._connection(key, self._timeout if timeout is None else timeout)
            try:
                connection.request("GET", target, headers=dict(headers or {}))
                answer = connection.getresponse()
                return Response(answer.status, answer.read())
            except (OSError, http.client.HTTPException) as exc:
                self._drop(key, connection)
                stale = isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError))
                if self._closed or not (reused and stale) or attempt:
                    raise HttpError(f"GET {parts.scheme}://{parts.netloc}{parts.path}: {exc or type(exc).__name__}") \
                        from exc
        raise AssertionError("unreachable: the second attempt returns or raises")

    def close(self) -> None:
        """Close every connection, interrupting a request waiting on one; later requests fail."""
        with self._lock:
            self._closed = True
            connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            _shut(connection)

    def _connection(self, key: tuple[str, str], timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._closed:
                raise HttpError("the client is closed")
            connection = self._connections.get(key)
            reused = connection is not None and connection.sock is not None
            if connection is None:
                scheme, netloc = key
                connection = (http.client.HTTPSConnection(netloc, timeout=timeout, context=tls_context())
                              if scheme == "https" else http.client.HTTPConnection(netloc, timeout=timeout))
                self._connections[key] = connection
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        return connection, reused

    def _drop(self, key: tuple[str, str], connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if self._connections.get(key) is connection:
                del self._connections[key]
        _shut(connection)


def _shut(connection: http.client.HTTPConnection) -> None:
    """Shut the connection's socket down (waking a thread blocked reading it), then close it."""
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed by the peer
            sock.shutdown(socket.SHUT_RDWR)
    connection.close()
