"""Uvicorn in a daemon thread on a socket bound before start, so port 0 works and the bound port is known."""

from __future__ import annotations

import logging
import socket
import threading

import uvicorn
from fastapi import FastAPI

from shardherd.shared.errors import ConfigError

log = logging.getLogger(__name__)


class ApiServer:
    """A running HTTP server for one app; `stop()` ends it and joins the thread."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
            # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on accepted sockets of that protocol, and
            # without it every answer waited about 40 ms (its body held back until the client's delayed ACK).
            self._socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._socket.bind((host, port))
            self._socket.listen(128)  # connections queue from now on, before uvicorn starts serving
        except OSError as exc:
            raise ConfigError(f"cannot serve the API on {host}:{port}: {exc}") from exc
        self.host = host
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="operator-api", daemon=True)

    @property
    def url(self) -> str:
        """The base URL of the server."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> ApiServer:
        """Start serving in the background."""
        self._thread.start()
        log.info("operator API on %s", self.url)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask uvicorn to exit, wait for the thread, close the socket."""
        self._server.should_exit = True
        self._thread.join(timeout)
        self._socket.close()
