"""The limits proxy talks to kinesalite over a bounded set of kept-alive connections, whatever the callers' burst.

In the 256-shard scale run every burst of calls made the proxy open one new connection per call, and kinesalite on
the loaded host served a new connection 2-5 s after it was made while kept-alive ones answered in well under a second;
Node also closed a connection idle for 5 s, so the next burst opened new ones again
(docs/decisions/0029-kinesis-limits-model.md, session 27 amendment). Real processes on 127.0.0.1: a kinesalite of
its own (its connections are counted) and the proxy in front of it; about 10 s.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psutil

from shardherd.services.emulators.http_wire import UPSTREAM_CONNECTIONS, Upstream
from shardherd.services.emulators.kinesalite import Kinesalite
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.ports import LOOPBACK
from shardherd.shared.aws import make_client
from tests.support.stream_stack import active_stream

STREAM = "proxy-upstream"
CALLERS = 3 * UPSTREAM_CONNECTIONS  # clients calling at once, each on a connection of its own to the proxy
CALLS = 4  # per client


def _connections_to(emulator: Kinesalite) -> int:
    """Established TCP connections accepted by the emulator's process."""
    node = psutil.Process(emulator.pid)
    return sum(1 for connection in node.net_connections(kind="tcp")
               if connection.status == psutil.CONN_ESTABLISHED and connection.laddr.port == emulator.port)


def _burst(endpoint: str, iterators: list[str]) -> list[BaseException]:
    """CALLERS clients each making CALLS GetRecords at once; the errors they met."""
    errors: list[BaseException] = []
    start = threading.Barrier(CALLERS)

    def call(iterator: str) -> None:
        kinesis: Any = make_client("kinesis", "us-east-1", endpoint)
        start.wait()
        try:
            for _ in range(CALLS):
                iterator = kinesis.get_records(ShardIterator=iterator, Limit=10)["NextShardIterator"]
                time.sleep(0.3)  # within the shard's 5 calls per second
        except Exception as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(iterator,)) for iterator in iterators]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


def test_a_burst_reuses_a_bounded_set_of_kept_alive_connections() -> None:
    with Kinesalite() as emulator, KinesisLimits(emulator.port) as limits:
        setup = make_client("kinesis", "us-east-1", limits.endpoint_url)
        active_stream(setup, STREAM, CALLERS)
        shards = [f"shardId-{index:012d}" for index in range(CALLERS)]
        iterators = [setup.get_shard_iterator(StreamName=STREAM, ShardId=shard,
                                              ShardIteratorType="LATEST")["ShardIterator"] for shard in shards]
        assert _burst(limits.endpoint_url, iterators) == []
        after_burst = _connections_to(emulator)
        time.sleep(6.0)  # longer than Node's default keep-alive timeout (5 s)
        after_idle = _connections_to(emulator)
    assert 1 <= after_burst <= UPSTREAM_CONNECTIONS, (
        f"{after_burst} connections from the proxy to kinesalite after {CALLERS} callers at once")
    assert after_idle == after_burst, f"kinesalite closed idle connections: {after_burst} -> {after_idle}"


def test_an_upstream_that_stops_answering_frees_its_exchanges_at_the_deadline() -> None:
    """A loopback server that reads requests and never answers: each call fails at the deadline (the proxy then
    answers its caller 502) and closes its connection, so the one exchange is free for the next call."""

    async def scenario() -> tuple[list[float], int]:
        closed = 0

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal closed
            while await reader.read(4096):
                pass  # never answers
            closed += 1
            writer.close()

        server = await asyncio.start_server(silent, LOOPBACK, 0)
        upstream = Upstream(server.sockets[0].getsockname()[1], connections=1, deadline=0.3)
        waited = []
        for _ in range(2):
            start = time.monotonic()
            try:
                await upstream.post({}, b"{}")
            except TimeoutError:
                waited.append(time.monotonic() - start)
        await asyncio.sleep(0.2)  # the server sees both connections closed
        server.close()
        return waited, closed

    waited, closed = asyncio.run(asyncio.wait_for(scenario(), 10.0))  # without the deadline: fails here
    assert len(waited) == 2 and all(0.25 <= seconds < 2.0 for seconds in waited), waited
    assert closed == 2
