"""The operator API's HTTP server answers at once: no answer waits for the client's delayed ACK.

uvicorn writes an answer's headers and body apart; with Nagle's algorithm on the accepted socket the body waited for
the client's ACK of the headers, which Linux delays by about 40 ms, so every request on a kept-alive connection took
about 44 ms however little the handler did (`/healthz`, the agents' long-polls, `/v1/assignments`).
"""

from __future__ import annotations

import statistics
import time

import httpx

from shardherd.services.api import create_app
from shardherd.services.api.server import ApiServer
from shardherd.shared.memory_store import MemoryLeaseStore
from shardherd.shared.store import TableNames
from tests.services.harness import Replica

DELAYED_ACK_SECONDS = 0.040  # Linux's shortest delayed ACK (TCP_DELACK_MIN)


def test_answers_on_a_kept_alive_connection_do_not_wait_for_the_clients_delayed_ack() -> None:
    replica = Replica(MemoryLeaseStore(TableNames.for_application("api-server")), shards=8)
    replica.join("w1")
    replica.step(2)
    server = ApiServer(create_app(replica.context), "127.0.0.1", 0).start()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:  # one connection, kept alive
            for path in ("/healthz", "/v1/assignments"):
                assert client.get(path).status_code == 200  # connected, and the route warmed up
                times = []
                for _ in range(20):
                    began = time.perf_counter()
                    assert client.get(path).status_code == 200
                    times.append(time.perf_counter() - began)
                assert statistics.median(times) < DELAYED_ACK_SECONDS / 2, (path, times)
    finally:
        server.stop()
