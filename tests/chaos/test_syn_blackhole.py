"""The chaos proxy's SYN blackhole: new connections time out in connect (the kernel drops SYNs once the listen backlog
is full, as a firewall that drops packets does), requests on open connections hang; both end when it is lifted.

Real sockets on 127.0.0.1; the proxy forwards to a one-line HTTP server.
"""

from __future__ import annotations

import socket
import time
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler

import httpx

from tests.support.chaos_proxy import Chaos, ChaosProxy
from tests.support.faulty_proxy import LoopbackServer


class Ok(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


def test_a_syn_blackhole_times_out_connects_and_hangs_open_connections() -> None:
    with LoopbackServer(Ok) as upstream, ChaosProxy(f"http://127.0.0.1:{upstream.port}") as proxy, \
            httpx.Client(timeout=2) as open_client, ExitStack() as sockets:
        assert open_client.post(proxy.endpoint_url, content=b"{}").status_code == 200  # a kept-alive connection
        proxy.set(Chaos(syn_dropped=True))
        time.sleep(0.3)  # the accept loop parks
        with_timeout = httpx.Timeout(2, connect=0.5)
        try:
            open_client.post(proxy.endpoint_url, content=b"{}", timeout=with_timeout)
            raise AssertionError("a request on an open connection was answered")
        except httpx.ReadTimeout:
            pass
        outcomes = []
        for _ in range(20):  # the backlog takes a few; the kernel drops the SYNs of the rest
            sock = sockets.enter_context(socket.socket())
            sock.settimeout(0.5)
            try:
                sock.connect(("127.0.0.1", proxy.port))
                outcomes.append("connected")
            except TimeoutError:
                outcomes.append("timed out")
                break
        assert "timed out" in outcomes, outcomes
        proxy.set(Chaos())
        with httpx.Client(timeout=5) as fresh:
            assert fresh.post(proxy.endpoint_url, content=b"{}").status_code == 200
