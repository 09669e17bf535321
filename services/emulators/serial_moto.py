"""moto's HTTP server with one request handled at a time: DynamoDB applies each write to an item atomically.

moto's own server (`python -m moto.server`) runs its backends on several threads without a lock, so two conditional
writes to one item can both read the old item and both succeed, which real DynamoDB never allows. Connections are
still accepted concurrently; only the backend calls are serialized.

    python -m shardherd.services.emulators.serial_moto -H 127.0.0.1 -p 5000
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def serialized(app: WsgiApp) -> WsgiApp:
    """A WSGI app that runs `app` for one request at a time and reads its whole response inside the lock."""
    lock = threading.Lock()

    def handle(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        with lock:
            return [b"".join(app(environ, start_response))]

    return handle


def main(argv: list[str] | None = None) -> None:
    """Serve moto's backends on the given loopback host and port until killed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args(argv)
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(args.host, args.port, serialized(app), threaded=True)


if __name__ == "__main__":
    main()
