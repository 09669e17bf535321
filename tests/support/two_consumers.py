"""Two shardherd applications reading one stream through the Kinesis limits proxy, for a test and a bench.

Each application is a coordinator and one plain agent (user defaults for reads unless the caller passes limits),
with its own lease table and ledger; a paced producer writes through the same proxy. The result says whether both
kept up (every record delivered to each application soon after the producer stopped), how often each polled per
shard per second (the agents' own /metrics) and what the proxy counted (calls, throttles).
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from typing import Any

import httpx

from shardherd.agent.read_spec import ReadLimits
from shardherd.agent.runtime import Agent
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from tests.support.ledger import Ledger, LedgerProcessor
from tests.support.stream_stack import StreamStack
from tests.support.waiting import wait_for

_CALLS = re.compile(r'^shardherd_shard_(get_records_calls|read_throttled)_total\{lease="[^"]+"\} ([0-9.e+]+)$', re.M)
TICK = 0.1


@dataclass(frozen=True)
class AppFigures:
    """One application's reads over the producing window."""

    calls_per_shard_second: float  # GetRecords calls per shard per second, from the agent's /metrics
    throttled: int  # calls Kinesis throttled, from the agent's /metrics
    drain_seconds: float  # from the producer's stop until every record was delivered


@dataclass(frozen=True)
class TwoConsumers:
    """What one run measured."""

    apps: dict[str, AppFigures]
    written: int
    seconds: float
    proxy_calls: int  # GetRecords calls the proxy admitted on the stream in the window, both applications
    proxy_throttled: int  # GetRecords calls it throttled (ReadProvisionedThroughputExceeded)
    write_throttled: int

    @property
    def throttled_fraction(self) -> float:
        """Throttled GetRecords calls per GetRecords call made, both applications."""
        return self.proxy_throttled / max(1, self.proxy_calls + self.proxy_throttled)


def _agent_calls(agent: Agent) -> tuple[float, int]:
    assert agent.health is not None
    text = httpx.get(f"http://127.0.0.1:{agent.health.port}/metrics", timeout=5).text
    totals = {"get_records_calls": 0.0, "read_throttled": 0.0}
    for name, value in _CALLS.findall(text):
        totals[name] += float(value)
    return totals["get_records_calls"], int(totals["read_throttled"])


def _stream_counts(limits: KinesisLimits, stream: str) -> dict[str, int]:
    totals: dict[str, int] = {}
    for key, counts in limits.counts()["shards"].items():
        if key.startswith(f"{stream}/"):
            for metric, value in counts.items():
                totals[metric] = totals.get(metric, 0) + int(value)
    return totals


def _produce(kinesis: Any, stream: str, rate: float, size: int, seconds: float) -> int:
    """Put `rate` records/s of `size` bytes for `seconds`, resending throttled ones; the records written."""
    written, owed = 0, 0.0
    pending: list[dict[str, Any]] = []
    started = last = time.monotonic()
    serial = 0
    while (now := time.monotonic()) - started < seconds or pending:
        owed += rate * (now - last) if now - started < seconds else 0.0
        last = now
        due = int(owed)
        owed -= due
        for _ in range(due):
            pending.append({"Data": f"{serial:08d}".encode().ljust(size, b"."), "PartitionKey": f"k{serial % 97}"})
            serial += 1
        rejected: list[dict[str, Any]] = []
        for start in range(0, len(pending), 500):
            batch = pending[start:start + 500]
            answer = kinesis.put_records(StreamName=stream, Records=batch)
            written += sum(1 for entry in answer["Records"] if "SequenceNumber" in entry)
            rejected += [entry for entry, result in zip(batch, answer["Records"], strict=True) if "ErrorCode" in result]
        pending = rejected
        time.sleep(TICK)
    return written


def _owns_all(stack: StreamStack, worker: str, shards: int) -> bool:
    return list(stack.owners().values()) == [worker] * shards


def _delivered(ledger: Ledger, count: int) -> bool:
    return len(ledger.payloads()) >= count


def run_two_consumers(moto: MotoServer, limits: KinesisLimits, shards: int, rate: float, size: int,
                      seconds: float, read_limits: ReadLimits | None = None) -> TwoConsumers:
    """Two applications on one `shards`-shard stream written at `rate` records/s of `size` bytes for `seconds`."""
    first = StreamStack(moto, limits, shards, prefix="beside-a")
    second = StreamStack(moto, limits, 1, prefix="beside-b", stream_name=first.app)
    stacks = {"a": first, "b": second}
    ledgers = {name: Ledger() for name in stacks}
    agents: dict[str, Agent] = {}
    try:
        for name, stack in stacks.items():
            agents[name] = Agent(stack.settings(f"{name}-1", agent_health_port=0),
                                 functools.partial(LedgerProcessor, ledgers[name], f"{name}-1"),
                                 limits=read_limits).start()
        for name, stack in stacks.items():
            wait_for(functools.partial(_owns_all, stack, f"{name}-1", shards), 60,
                     f"application {name} owns every lease")
        time.sleep(1.5)  # both caught up on the empty stream
        before = {name: _agent_calls(agent) for name, agent in agents.items()}
        counts_before = _stream_counts(limits, first.app)
        kinesis = make_client("kinesis", "us-east-1", limits.endpoint_url)
        started = time.monotonic()
        written = _produce(kinesis, first.app, rate, size, seconds)
        stopped = time.monotonic()
        window = stopped - started
        after = {name: _agent_calls(agent) for name, agent in agents.items()}
        counts_after = _stream_counts(limits, first.app)
        drains = {name: wait_for(functools.partial(_delivered, ledger, written), 30,
                                 f"application {name} delivered all {written} records")
                  for name, ledger in ledgers.items()}
    finally:
        for agent in agents.values():
            agent.stop(drain=False)
        for stack in stacks.values():
            stack.close()
    apps = {name: AppFigures((after[name][0] - before[name][0]) / shards / window, after[name][1] - before[name][1],
                             drains[name]) for name in stacks}

    def delta(metric: str) -> int:
        return counts_after.get(metric, 0) - counts_before.get(metric, 0)

    return TwoConsumers(apps, written, window, delta("GetRecords.Success"), delta("ReadProvisionedThroughputExceeded"),
                        delta("WriteProvisionedThroughputExceeded"))


