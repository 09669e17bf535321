"""The agent's health port (plain agents and Spark drivers): /healthz for a livenessProbe, /metrics for Prometheus.

/healthz answers 503 once a critical thread (heartbeat, lease keeper; a Spark driver's query supervisor) failed or
made no progress within its bound (shared/supervision.py), or while a held lease's reader makes none
(agent/stall_watch.py), 200 otherwise. A lease kept in a fleet-wide stall (the leader's verdict, decision 0039) is
no health problem: restarting every pod cannot bring a shared Kinesis back, so /healthz stays 200 and says so, and
/metrics shows it (`shardherd_fleet_stall_verdict`, the lease's stalled seconds). Likewise a lease whose reads
stalled at another worker too (the leader's per-lease verdict, decision 0043): a restart cannot fix a shard, so it
is kept with /healthz 200 naming it (`shardherd_shard_stall_held_leases`). /metrics carries the supervised
threads' restarts and progress, the stalled leases and those given back for it, each shard stuck on a failing batch
(since when, attempts, the last error as a label), and on plain agents each shard's GetRecords calls and Kinesis
throttles (ProvisionedThroughputExceededException).
`POST /drain[?wait=SECONDS]` makes the agent drain itself and stop (its leases handed on gracefully), waiting up to
`wait` seconds for that: 200 once stopped, 202 while still draining. With `restart=DURATION` (e.g. `60s`) it stops for a
restart instead: its leases stay reserved for it that long (shared/restart.py). Only a caller on the loopback interface
may ask (403 otherwise): a preStop hook in the agent's own pod, which so needs no credential at all, where the
coordinator's drain endpoint takes the admin token (least privilege: nothing outside the pod can drain it through this
port).
Served by the standard library's threading HTTP server: no request touches the store.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from shardherd.agent.progress import ProgressBoard
from shardherd.agent.reader import ReaderStats
from shardherd.agent.stall_watch import StallWatch
from shardherd.shared.restart import BadRestartWindow, parse_window
from shardherd.shared.supervision import Supervisor
from shardherd.shared.supervision_report import supervision_families
from shardherd.shared.worker import FailingBatch

log = logging.getLogger(__name__)

MAX_ERROR_LABEL = 200
MAX_DRAIN_WAIT_SECONDS = 300.0

# Start draining, or with a window (ms) stop for a restart (once); True if the agent stopped within the given seconds.
SelfDrain = Callable[[float, int | None], bool]


def is_loopback(host: str) -> bool:
    """True for a caller on the loopback interface (127.0.0.0/8, ::1, an IPv4-mapped loopback)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


def failing_families(failing: dict[str, FailingBatch], now: float) -> list[Metric]:
    """Per shard stuck on a failing batch: the attempts so far and the seconds since the first failure."""
    attempts = GaugeMetricFamily("shardherd_shard_failing_batch_attempts",
                                 "Failed deliveries of the batch a shard is stuck on (it blocks; nothing is skipped)",
                                 labels=["lease", "last_error"])
    stuck = GaugeMetricFamily("shardherd_shard_failing_batch_seconds",
                              "Seconds a shard has been stuck on a failing batch", labels=["lease"])
    for key, batch in sorted(failing.items()):
        attempts.add_metric([key, batch.last_error[:MAX_ERROR_LABEL]], batch.attempts)
        stuck.add_metric([key], max(0.0, now - batch.since))
    return [attempts, stuck]


def poison_families(board: ProgressBoard) -> list[Metric]:
    """Per shard: the poison record it is blocked on (sequence, sub-sequence), and the records it quarantined."""
    blocked = GaugeMetricFamily("shardherd_shard_poison_record",
                                "1 while a shard is blocked on a poison record (found by bisecting its failing batch)",
                                labels=["lease", "sequence", "sub_sequence"])
    for key, record in sorted(board.poisoned().items()):
        blocked.add_metric([key, record.sequence_number, str(record.sub_sequence_number)], 1)
    quarantined = CounterMetricFamily("shardherd_shard_quarantined_records",
                                      "Poison records written to the poison destination and checkpointed past",
                                      labels=["lease"])
    for key, count in sorted(board.quarantined().items()):
        quarantined.add_metric([key], count)
    return [blocked, quarantined]


def read_families(reads: Mapping[str, ReaderStats]) -> list[Metric]:
    """Per lease read on this worker: GetRecords calls made and calls Kinesis throttled (since the agent started)."""
    calls = CounterMetricFamily("shardherd_shard_get_records_calls", "GetRecords calls made on the shard",
                                labels=["lease"])
    throttled = CounterMetricFamily("shardherd_shard_read_throttled",
                                    "GetRecords and GetShardIterator calls Kinesis throttled on the shard "
                                    "(ProvisionedThroughputExceededException; retried after a jittered backoff)",
                                    labels=["lease"])
    for key, stats in sorted(reads.items()):
        calls.add_metric([key], stats.get_records_calls)
        throttled.add_metric([key], stats.throttled)
    return [calls, throttled]


def stall_families(stalls: StallWatch) -> list[Metric]:
    """Held leases whose reader makes no progress (seconds), how many were given back for it, the fleet's verdict."""
    stalled = GaugeMetricFamily("shardherd_lease_stalled_seconds",
                                "Seconds a held lease's reader has made no progress (past the red bound)",
                                labels=["lease", "reader_running"])
    for state in stalls.stalled():
        stalled.add_metric([state.lease_key, str(state.running).lower()], state.seconds)
    given_up = CounterMetricFamily("shardherd_leases_given_up", "Held leases given back because their reader made "
                                   "no progress (dead, not restarted, or hung past the failover time)",
                                   value=stalls.given_up)
    fleet = GaugeMetricFamily("shardherd_fleet_stall_verdict", "1 while the leader's fresh verdict says most "
                              "lease-holding workers stall at once: stalled leases are kept, health stays green "
                              "(decision 0039)", value=1 if stalls.fleet_stalls() else 0)
    shard = GaugeMetricFamily("shardherd_shard_stall_held_leases", "Stalled leases kept because the leader's fresh "
                              "verdict says their reads stalled at another worker too: the shard's fault, not this "
                              "worker's (decision 0043)",
                              value=sum(1 for state in stalls.held() if state.shard_stalled))
    return [stalled, given_up, fleet, shard]


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        """The families of one scrape."""
        return self._families


class HealthServer:
    """Serves /healthz and /metrics on `host:port` (port 0: any free port; `port` is then the bound one)."""

    def __init__(self, supervisor: Supervisor, failing: Callable[[], dict[str, FailingBatch]],
                 wall: Callable[[], float], stalls: StallWatch, host: str, port: int,
                 reads: Callable[[], Mapping[str, ReaderStats]] | None = None, drain: SelfDrain | None = None,
                 poison: ProgressBoard | None = None) -> None:
        self._supervisor = supervisor
        self._stalls = stalls
        self._drain = drain
        self._failing = failing
        self._reads = reads
        self._poison = poison
        self._wall = wall
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="health-server", daemon=True)

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        """Serve in a daemon thread."""
        self._thread.start()
        log.info("agent health endpoint on http://%s:%d/healthz", *self._server.server_address[:2])
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()

    def _fine(self) -> str:
        """The detail of a green /healthz: all progressing, or stalled leases kept for the leader's verdict."""
        shard = sorted(state.lease_key for state in self._stalls.held() if state.shard_stalled)
        if self._stalls.fleet_stalls():
            kept = len(self._stalls.stalled_keys())
            return (f"alive; the leader reports a fleet-wide stall (Kinesis failing for most workers): {kept} stalled "
                    "leases kept while their readers retry (a restart would not help; decision 0039)")
        if shard:
            return (f"alive; leases {', '.join(shard)} stall at every owner (the leader's verdict: the shard's fault "
                    "or the service's), kept while their readers retry (a restart would not help; decision 0043)")
        return "alive, every critical thread and held lease making progress"

    def _metrics(self) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families([*supervision_families(self._supervisor),
                                     *failing_families(self._failing(), self._wall()),
                                     *stall_families(self._stalls),
                                     *(read_families(self._reads()) if self._reads is not None else []),
                                     *(poison_families(self._poison) if self._poison is not None else [])]))
        return generate_latest(registry)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/healthz":
                    problem = server._supervisor.problem() or server._stalls.problem()
                    body = json.dumps({"status": "ok" if problem is None else "unavailable",
                                       "detail": problem or server._fine()}).encode()
                    self._send(200 if problem is None else 503, "application/json", body)
                elif self.path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, server._metrics())
                else:
                    self._send(404, "application/json", b'{"status": "not found"}')

            def do_POST(self) -> None:
                url = urlsplit(self.path)
                if url.path != "/drain" or server._drain is None:
                    self._send(404, "application/json", b'{"status": "not found"}')
                elif not is_loopback(self.client_address[0]):
                    log.warning("refused a drain request from %s: only the agent's own pod may ask (loopback)",
                                self.client_address[0])
                    self._send(403, "application/json", b'{"status": "forbidden: loopback callers only"}')
                else:
                    query = parse_qs(url.query)
                    try:
                        wait = min(MAX_DRAIN_WAIT_SECONDS, max(0.0, float(query.get("wait", ["0"])[0])))
                    except ValueError:
                        self._send(400, "application/json", b'{"status": "wait must be a number of seconds"}')
                        return
                    try:
                        restart = parse_window(query["restart"][0]) if "restart" in query else None
                    except BadRestartWindow as exc:
                        self._send(400, "application/json", json.dumps({"status": str(exc)}).encode())
                        return
                    stopped = server._drain(wait, restart)
                    body = json.dumps({"status": "stopped" if stopped else "draining"}).encode()
                    self._send(200 if stopped else 202, "application/json", body)

            def _send(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Probes every few seconds would flood the log."""

        return Handler
