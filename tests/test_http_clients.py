"""The HTTP clients: httpx's (shared/lean_httpx.py) and the agent's standard-library one (shared/plain_http.py).

https clients of both verify certificates with one context per process, plain-http ones build none; the plain
client keeps its connection, reconnects once to a server that closed it, ends a waiting request when closed from
another thread, and gives up at its timeout. Real sockets on 127.0.0.1.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from shardherd.services.emulators.ports import LOOPBACK
from shardherd.shared.lean_httpx import client, httpx, tls_context
from shardherd.shared.plain_http import HttpClient, HttpError


class _Hello(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn answers

    def do_GET(self) -> None:  # the standard library's name
        body = b"hello" if self.path == "/" else self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # the standard library's name
        """Quiet."""


@contextmanager
def _server(tls: ssl.SSLContext | None) -> Iterator[str]:
    """A loopback HTTP server answering 'hello' (over TLS with `tls`); yields its URL."""
    server = ThreadingHTTPServer((LOOPBACK, 0), _Hello)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://{LOOPBACK}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def self_signed(tmp_path: Path) -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate (which no CA bundle trusts)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={LOOPBACK}"],
                   check=True, capture_output=True, timeout=60)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def test_https_clients_verify_certificates_with_one_context_per_process(self_signed: ssl.SSLContext) -> None:
    tls_context.cache_clear()
    with _server(self_signed) as url:
        for _ in range(2):
            with client([url], timeout=5) as https, pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY"):
                https.get(url)
    built = tls_context.cache_info()
    assert (built.misses, built.hits) == (1, 1)  # the second client reused the first one's context


def test_plain_http_clients_build_no_tls_context() -> None:
    tls_context.cache_clear()
    with _server(None) as url, client([url], timeout=5) as plain:
        assert plain.get(url).text == "hello"
    assert tls_context.cache_info().misses == 0


def test_plain_clients_share_the_https_context_and_verify_certificates(self_signed: ssl.SSLContext) -> None:
    tls_context.cache_clear()
    with _server(self_signed) as url:
        for _ in range(2):
            with HttpClient(5) as https, pytest.raises(HttpError, match="CERTIFICATE_VERIFY"):
                https.get(url)
        with client([url], timeout=5) as httpx_client, pytest.raises(httpx.ConnectError):
            httpx_client.get(url)
    built = tls_context.cache_info()
    assert (built.misses, built.hits) == (1, 2)  # one context for both kinds of client


def test_a_plain_client_keeps_its_connection_and_sends_the_query() -> None:
    tls_context.cache_clear()
    with _server(None) as url, HttpClient(5) as plain:
        first = plain.get(url + "echo", params={"after": 3, "feed": "a b"})
        assert (first.status_code, first.text) == (200, "/echo?after=3&feed=a+b")
        sockets = {id(connection.sock) for connection in plain._connections.values()}
        assert plain.get(url).text == "hello"
        assert {id(connection.sock) for connection in plain._connections.values()} == sockets  # kept alive
    assert tls_context.cache_info().misses == 0


@contextmanager
def _listener() -> Iterator[socket.socket]:
    """A loopback socket that accepts and then does whatever the test does with the connection."""
    with socket.create_server((LOOPBACK, 0)) as server:
        yield server


def test_a_plain_client_reconnects_once_to_a_server_that_closed_its_idle_connection() -> None:
    with _listener() as server, HttpClient(5) as plain:
        url = f"http://{LOOPBACK}:{server.getsockname()[1]}/"
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

        def serve() -> None:
            first, _ = server.accept()
            first.recv(4096)
            first.sendall(answer)
            first.recv(4096)  # the second request on the kept connection: closed unanswered
            first.close()
            second, _ = server.accept()
            second.recv(4096)
            second.sendall(answer)
            second.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        assert plain.get(url).text == "ok"
        assert plain.get(url).text == "ok"  # sent again on a new connection
        thread.join(5)


def test_closing_a_plain_client_ends_a_waiting_request_at_once_and_a_silent_server_times_out() -> None:
    with _listener() as server:
        url = f"http://{LOOPBACK}:{server.getsockname()[1]}/wait"
        plain = HttpClient(30)
        failed: list[BaseException] = []

        def ask() -> None:
            try:
                plain.get(url)
            except HttpError as exc:
                failed.append(exc)

        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        waiting, _ = server.accept()  # the request arrived; the server never answers
        time.sleep(0.2)
        began = time.monotonic()
        plain.close()
        asking.join(5)
        assert not asking.is_alive() and len(failed) == 1 and time.monotonic() - began < 2.0
        with pytest.raises(HttpError, match="closed"):
            plain.get(url)
        began = time.monotonic()
        with HttpClient(0.5) as silent, pytest.raises(HttpError, match="timed out"):
            silent.get(url)
        assert time.monotonic() - began < 3.0
        waiting.close()
