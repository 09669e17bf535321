"""The control socket of a running stack: scenario commands ask the supervisor to start or kill processes.

One JSON object per line each way over a Unix socket in the run directory (only the same user can connect). Requests
are `{"op": ..., ...}`; answers are `{"ok": true, ...}` or `{"ok": false, "error": "..."}`.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardherd.shared.errors import ShardherdError

Handler = Callable[[dict[str, Any]], dict[str, Any]]


class ControlError(ShardherdError):
    """The supervisor refused or could not carry out a control request."""


class _Connection(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        handler: Handler = self.server.handler  # type: ignore[attr-defined]
        for line in self.rfile:
            try:
                answer = {"ok": True, **handler(json.loads(line))}
            except (ShardherdError, ValueError, KeyError) as exc:
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            self.wfile.write(json.dumps(answer).encode() + b"\n")
            self.wfile.flush()


class ControlServer:
    """Serves requests on `path` in a background thread, each through `handler`."""

    def __init__(self, path: Path, handler: Handler) -> None:
        path.unlink(missing_ok=True)
        self.path = path
        self._server = socketserver.ThreadingUnixStreamServer(str(path), _Connection)
        self._server.daemon_threads = True
        self._server.handler = handler  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, name="control", daemon=True)

    def start(self) -> ControlServer:
        """Start serving."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket file."""
        self._server.shutdown()
        self._server.server_close()
        self.path.unlink(missing_ok=True)


def request(path: str, op: str, timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
    """Send one request to the stack's control socket; ControlError with the supervisor's reason on failure."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout)
            connection.connect(path)
            connection.sendall(json.dumps({"op": op, **fields}).encode() + b"\n")
            reply = connection.makefile("rb").readline()
    except OSError as exc:
        raise ControlError(f"cannot reach the stack's control socket {path}: {exc}") from exc
    answer: dict[str, Any] = json.loads(reply) if reply else {"ok": False, "error": "no answer"}
    if not answer.get("ok"):
        raise ControlError(str(answer.get("error")))
    return answer
