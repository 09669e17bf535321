"""A long-running, switchable fault proxy: FaultyProxy plus live knobs for latency, error rates and a partition.

Scheduled faults (FaultyProxy's queue) are served first; otherwise each request meets the current `Chaos` settings:
a partition drops every connection unanswered; a hang holds every request unanswered until the hang is lifted (or
the proxy closes) and then drops it, so clients wait out their own timeouts as against a blackholed endpoint; a SYN
blackhole also stops accepting connections (the listen backlog fills, then the kernel drops every SYN: clients wait
out their connect timeout, as against a firewall that drops packets) while requests on open ones hang; a
fixed `reply` answers every request with that canned fault (AccessDenied, ExpiredToken, a malformed 200); else a
seeded draw picks a throttling reply, a 500, a dropped connection, a reply lost after the server applied the
request, or a plain forward, each after the configured latency. One proxy per process makes it easy to cut a single
agent off from the store while the others pass. With `shard` set, only Kinesis requests on that shard meet the chaos
(GetShardIterator naming it, GetRecords with an iterator the proxy saw issued for it: it follows each shard's
iterator chain through the answers it forwards); every other request passes. With `writes_only`, only DynamoDB
writes meet the chaos (a store that answers reads and refuses writes, as a read-only SQLite file does). The knobs
are set from the test or bench in the same Python process.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

from tests.support.faulty_proxy import DROPPED, INTERNAL_ERROR, REPLY_LOST, THROTTLED, Fault, FaultyProxy


@dataclass(frozen=True)
class Chaos:
    """What the proxy does to unscheduled requests; rates are probabilities per request, latency in seconds."""

    latency: float = 0.0
    throttle_rate: float = 0.0
    error_rate: float = 0.0
    drop_rate: float = 0.0
    lost_reply_rate: float = 0.0  # applied by the server, then the connection drops unanswered (REPLY_LOST)
    partitioned: bool = False
    hang: bool = False  # a blackholed endpoint: requests get no answer until the proxy closes or hang is switched off
    reply: Fault | None = None  # every request answered with this canned fault
    syn_dropped: bool = False  # no connection accepted (SYNs dropped once the backlog is full); open ones hang
    shard: str | None = None  # only requests on this Kinesis shard meet the chaos (see the module's docstring)
    writes_only: bool = False  # only DynamoDB writes meet the chaos; reads pass (a store that refuses writes)

    def __post_init__(self) -> None:
        rates = (self.throttle_rate, self.error_rate, self.drop_rate, self.lost_reply_rate)
        if any(not 0.0 <= rate <= 1.0 for rate in rates) or sum(rates) > 1.0 or self.latency < 0:
            raise ValueError(f"rates must be probabilities summing to at most 1 and latency >= 0: {self}")


CALM = Chaos()
DYNAMODB_WRITES = (".PutItem", ".UpdateItem", ".DeleteItem", ".BatchWriteItem", ".TransactWriteItems")


class ChaosProxy(FaultyProxy):
    """A FaultyProxy whose unscheduled requests follow switchable `Chaos` settings (thread-safe to change)."""

    def __init__(self, upstream: str, seed: int = 0) -> None:
        super().__init__(upstream)
        self._chaos = CALM
        self._rng = random.Random(seed)
        self._chaos_lock = threading.Lock()
        self.served: Counter[str] = Counter()  # chaos replies by kind: throttled, error, dropped, reply lost, ...
        self._closing = threading.Event()  # set on exit: hung requests end, so closing the server does not wait
        self._iterators: dict[str, str] = {}  # a Kinesis shard iterator answered -> its shard (the newest per chain)
        accept = self._server.get_request

        def get_request() -> tuple[Any, Any]:
            """Accept nothing while SYNs are dropped: the kernel's backlog fills and it drops the rest."""
            while self.chaos.syn_dropped and not self._closing.wait(0.1):
                pass
            return accept()

        self._server.get_request = get_request  # type: ignore[method-assign]

    @property
    def chaos(self) -> Chaos:
        """The settings in force."""
        with self._chaos_lock:
            return self._chaos

    def set(self, chaos: Chaos) -> None:
        """Switch to new settings; requests already waiting out their latency keep their earlier draw."""
        with self._chaos_lock:
            self._chaos = chaos

    def update(self, **changes: float | bool) -> None:
        """Change some knobs, keep the others."""
        with self._chaos_lock:
            self._chaos = replace(self._chaos, **changes)  # type: ignore[arg-type]

    def _draw(self) -> tuple[float, Fault | None]:
        with self._chaos_lock:
            chaos = self._chaos
            if chaos.partitioned:
                self.served["partitioned"] += 1
                return 0.0, DROPPED
            if chaos.reply is not None:
                self.served["replied"] += 1
                return chaos.latency, chaos.reply
            roll = self._rng.random()
            for kind, rate, fault in (("throttled", chaos.throttle_rate, THROTTLED),
                                      ("error", chaos.error_rate, INTERNAL_ERROR),
                                      ("dropped", chaos.drop_rate, DROPPED),
                                      ("reply lost", chaos.lost_reply_rate, REPLY_LOST)):
                if roll < rate:
                    self.served[kind] += 1
                    return chaos.latency, fault
                roll -= rate
            return chaos.latency, None

    def __enter__(self) -> ChaosProxy:
        super().__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._closing.set()
        super().__exit__(exc_type, exc, tb)

    def _next_for(self, target: str, body: bytes) -> Fault | None:
        chaos = self.chaos
        if (chaos.shard is not None and self._shard_of(body) != chaos.shard) or (
                chaos.writes_only and not target.endswith(DYNAMODB_WRITES)):
            return FaultyProxy._next(self, target)  # scheduled faults only
        return self._next(target)

    def _shard_of(self, body: bytes) -> str | None:
        """The Kinesis shard a request is on: the ShardId it names, or the shard of the iterator it reads from."""
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            return None
        if not isinstance(request, dict):
            return None
        if "ShardId" in request:
            return str(request["ShardId"])
        with self._chaos_lock:
            return self._iterators.get(str(request.get("ShardIterator")))

    def _answered(self, target: str, body: bytes, payload: bytes) -> None:
        """Follow the iterator chains: GetShardIterator's answer, then each GetRecords' next iterator."""
        if not target.endswith((".GetShardIterator", ".GetRecords")):
            return
        try:
            request, answer = json.loads(body), json.loads(payload)
        except ValueError:
            return
        with self._chaos_lock:
            if target.endswith(".GetShardIterator"):
                shard = request.get("ShardId")
            else:
                shard = self._iterators.pop(str(request.get("ShardIterator")), None)
            issued = answer.get("ShardIterator") or answer.get("NextShardIterator")
            if shard is not None and issued:
                self._iterators[str(issued)] = str(shard)

    def _next(self, target: str) -> Fault | None:
        scheduled = super()._next(target)
        if scheduled is not None:
            return scheduled
        if self.chaos.hang or self.chaos.syn_dropped:
            self.served["hung"] += 1
            while (self.chaos.hang or self.chaos.syn_dropped) and not self._closing.wait(0.1):
                pass
            return DROPPED
        latency, fault = self._draw()
        if latency:
            time.sleep(latency)
        return fault
