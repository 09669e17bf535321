"""shared/lean_httpx.py's clients: https ones verify with one context per process, plain-http ones build none."""

from __future__ import annotations

import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from shardherd.services.emulators.ports import LOOPBACK
from shardherd.shared.lean_httpx import client, httpx, tls_context


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # the standard library's name
        body = b"hello"
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
