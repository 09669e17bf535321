"""A shard read by another application at its read-call limit: the agent's throttled reads reach the operator API.

Through the Kinesis limits proxy (5 GetRecords calls per shard per second, shared by every reader, as AWS counts
them), a neighbour polls the one shard flat out; the plain agent's reads are throttled, retried after a jittered
backoff, counted in its /metrics, carried in its worker row as the last minute's count, and shown by the
coordinator's `/v1/assignments` (the dashboard's "throttled/min" column) and `/metrics`.
"""

from __future__ import annotations

import functools
import threading

import httpx
import pytest

from shardherd.agent.runtime import Agent
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.worker import NO_PROGRESS
from tests.support.ledger import Ledger, LedgerProcessor
from tests.support.stores import worker_record
from tests.support.stream_stack import StreamStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def _poll_flat_out(endpoint: str, stream: str, stop: threading.Event) -> None:
    """Another application's reader: GetRecords on the shard as fast as the proxy answers (throttled or not)."""
    kinesis = make_client("kinesis", "us-east-1", endpoint)
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard, ShardIteratorType="LATEST")[
        "ShardIterator"]
    while not stop.is_set():
        try:
            iterator = kinesis.get_records(ShardIterator=iterator, Limit=1)["NextShardIterator"]
        except kinesis.exceptions.ProvisionedThroughputExceededException:
            continue


def test_a_shard_at_its_read_limit_shows_the_agents_throttled_reads(moto_server: MotoServer,
                                                                   kinesalite: NodeEmulator) -> None:
    """About 10-20 s: a coordinator and an agent start, then the neighbour's polling throttles the agent's reads."""
    with KinesisLimits(kinesalite.port) as limits:
        stack = StreamStack(moto_server, limits, 1, prefix="throttled")
        agent = Agent(stack.settings("w1", agent_health_port=0), functools.partial(LedgerProcessor, Ledger(), "w1"))
        stop = threading.Event()
        neighbour = threading.Thread(target=_poll_flat_out, args=(limits.endpoint_url, stack.app, stop), daemon=True)
        try:
            agent.start()
            stack.wait_owned("w1")
            (key,) = stack.owners()
            neighbour.start()

            # The row's figure at each look. Every read of the agent fails while the neighbour polls, so its stall
            # watch may give the lease back (and the row drop it) before the test looks again: keep what it saw.
            seen: list[int] = []

            def row_throttled() -> bool:
                row = worker_record(stack.coordinator.store, "w1")
                seen.append(0 if row is None else row.lease_progress.get(key, NO_PROGRESS).throttled)
                return seen[-1] > 0

            wait_for(row_throttled, 30, "the agent's row carrying throttled reads")
            assert stack.coordinator.api is not None
            api = stack.coordinator.api.url
            wait_for(lambda: httpx.get(f"{api}/v1/assignments").json()["items"][0]["read_throttled"] > 0, 15,
                     "/v1/assignments showing them")
            metrics = httpx.get(f"{api}/metrics").text
            reported, proxy = max(seen), _proxy_throttled(limits, stack.app)
        finally:
            stop.set()
            agent.stop(drain=False)
            stack.close()
    assert f'shardherd_lease_read_throttled{{lease="{key}"}}' in metrics
    assert proxy >= reported > 0  # the proxy also counts the neighbour's throttled calls


def _proxy_throttled(limits: KinesisLimits, stream: str) -> int:
    """Read calls the limits proxy throttled on the stream's shards (every caller's)."""
    return sum(shard.get("ReadProvisionedThroughputExceeded", 0) for name, shard in limits.counts()["shards"].items()
               if name.startswith(f"{stream}/"))
