"""Wiring of one coordinator replica: store, leader lock keeper, leader loop, shard listing, and the operator API.

Every long-lived thread runs under the replica's Supervisor (shared/supervision.py, decision 0022): the lock keeper
and the leader loop are critical (a failure or a stall releases the lock and exits non-zero), the shard listing and
the replica report are restartable.
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from types import FrameType
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from shardherd.coordinator.leader_lock import LeaderLock
from shardherd.coordinator.leader_loop import LeaderLoop, ShardSource
from shardherd.coordinator.run_summary import RunSummary
from shardherd.coordinator.shard_listing import listing_client_timeouts
from shardherd.coordinator.stream_source import MultiStreamSource
from shardherd.services.api import ApiContext, ApiServer, create_app
from shardherd.services.api.auth import ApiTokens
from shardherd.services.api.snapshot import ApiSnapshot
from shardherd.services.leader_status import LeaderWatch
from shardherd.services.peer_client import PeerClient
from shardherd.services.replicas import CHECK_SECONDS, ReplicaReporter
from shardherd.shared.aws import make_client
from shardherd.shared.clock import Clock, SystemClock
from shardherd.shared.config import Settings, load_settings
from shardherd.shared.dynamo.errors import is_transient
from shardherd.shared.errors import ShardherdError
from shardherd.shared.retry import RetryPolicy, retry_deadline
from shardherd.shared.shard_lister import StreamNotFound, list_shards
from shardherd.shared.shards import Shard
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_factory import open_store
from shardherd.shared.supervision import Kind, Supervisor

log = logging.getLogger(__name__)

LOCK_KEEPER = "leader-lock"
LEADER_LOOP = "leader-loop"
API_REFRESH = "api-refresh"  # reads the API's tables ahead of callers with a token
GIVE_UP_SECONDS = 1.0  # how long letting go of the lock may take before the process exits anyway


def kinesis_shard_source(settings: Settings, clock: Clock) -> ShardSource | None:
    """A ListShards-backed shard source for the configured stream(s), or None when no stream is configured."""
    stream = settings.stream_name
    if stream is None and not settings.streams:
        return None
    client = _listing_client(settings)
    retry = RetryPolicy(clock=clock)
    if stream is None:
        return MultiStreamSource(client, settings.streams, retry)

    def source() -> list[Shard]:
        return list_shards(client, stream, retry)

    return source


def _listing_client(settings: Settings) -> Any:
    """A Kinesis client whose every call ends within half the shorter of failover time and shard-sync interval."""
    deadline = min(settings.failover_time_millis, settings.shard_sync_interval_millis) / 2000
    return make_client("kinesis", settings.region, settings.kinesis_endpoint_url,
                       timeouts=listing_client_timeouts(deadline))


def require_streams(settings: Settings, clock: Clock) -> None:
    """Raise StreamNotFound naming each configured stream that does not exist, before any table is created.

    A misspelled stream (or one in another region or account) would otherwise get a lease table of its own and a
    coordinator that warns on every shard sync. Other failures (the service not answering yet) are left to the shard
    sync, which retries them and reports them on /readyz.
    """
    if not settings.stream_names:
        return
    client = _listing_client(settings)  # a blackholed endpoint delays start-up by seconds, not minutes
    retry = RetryPolicy(clock=clock)
    missing = []
    for name in settings.stream_names:
        try:
            retry.call(partial(client.describe_stream_summary, StreamName=name), is_transient,
                       f"DescribeStreamSummary for {name}")
        except client.exceptions.ResourceNotFoundException:
            missing.append(name)
        except (ShardherdError, BotoCoreError, ClientError) as exc:
            log.warning("could not check that stream %s exists (%s); starting anyway", name, exc)
    if missing:
        variable = "SHARDHERD_STREAMS" if settings.streams else "SHARDHERD_STREAM_NAME"
        where = settings.kinesis_endpoint_url or f"region {settings.region}"
        raise StreamNotFound(
            f"stream {', '.join(missing)} does not exist at {where} ({variable}); not ready and no lease table "
            f"created for application {settings.application_name}: create the stream or correct the name")


@dataclass
class CoordinatorService:
    """A running replica: the lock keeper thread and the loop thread; `stop()` releases leadership at once."""

    settings: Settings
    store: LeaseStore
    lock: LeaderLock
    loop: LeaderLoop
    clock: Clock
    watch: LeaderWatch
    replicas: ReplicaReporter
    peers: PeerClient
    supervisor: Supervisor
    api: ApiServer | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def build(cls, settings: Settings, clock: Clock | None = None,
              exit: Callable[[int], None] | None = None) -> CoordinatorService:
        """Open the store (creating tables if needed) and construct the lock and the loop.

        `exit` ends the process when a critical thread fails or stalls (default: os._exit; tests record it).
        """
        clock = clock or SystemClock()
        require_streams(settings, clock)
        holder: list[LeaderLock] = []
        supervisor = Supervisor(clock, give_up=lambda why: _let_go(holder[0], clock),
                                exit=exit)
        store = open_store(settings, RetryPolicy(clock=clock), caller="coordinator")
        store.ensure_tables()
        watch = LeaderWatch(store, settings.worker_id, clock)
        peers = PeerClient(ApiTokens.from_settings(settings).for_peers())
        lock = LeaderLock(store, settings.worker_id, clock, settings.leader_lock_lease_duration_millis,
                          settings.leader_lock_heartbeat_period_millis, on_change=watch.on_lock_change,
                          last_success=watch.last_success_wall, holder_probe=peers.hold)
        holder.append(lock)
        replicas = ReplicaReporter(store, settings.worker_id, clock, lambda: (lock.is_leader(), lock.epoch()))

        def on_run(summary: RunSummary) -> None:
            replicas.note_run(summary)
            watch.on_run(summary, loop.viewed_leases)

        loop = LeaderLoop(store, lock, settings, clock, kinesis_shard_source(settings, clock), on_run=on_run,
                          on_progress=lambda: supervisor.beat(LEADER_LOOP), published_scale=watch.published_scale)
        return cls(settings, store, lock, loop, clock, watch, replicas, peers, supervisor)

    def start(self) -> None:
        """Start the operator API (on api_host:api_port; `api.port` is the bound one), the lock keeper and the loop."""
        context = ApiContext(self.settings, self.store, self.lock, self.loop, self.watch, self.clock,
                             from_leader=self._leaders_snapshot, supervisor=self.supervisor)
        self.api = ApiServer(create_app(context), self.settings.api_host, self.settings.api_port).start()
        url = self.settings.api_advertise_url or self.api.url
        self.replicas.set_api_url(url)
        self.lock.set_api_url(url)
        period = self.settings.leader_lock_heartbeat_period_millis / 1000
        duration = self.settings.leader_lock_lease_duration_millis / 1000
        interval = self.settings.lease_assignment_interval_millis / 1000
        supervise = self.supervisor
        # The lock keeper ticks often enough that heartbeats are never late behind a slow leader run. A critical
        # thread past its bound (the larger of three of its intervals and two lock durations) fails /healthz; the
        # process exits once it is also past GIVE_UP_FLOOR_SECONDS, so a loaded host's slow store calls do not end
        # it. The leader loop's fenced writes count as progress within a long run.
        bound = 2 * duration
        self._threads = [
            supervise.loop(LOCK_KEEPER, self.lock.tick, period / 3, Kind.CRITICAL, bound, self._stop),
            supervise.loop(LEADER_LOOP, lambda: self.loop.cycle(self._stop), 0.0, Kind.CRITICAL,
                           max(3 * interval, bound), self._stop),
            supervise.loop("replica-report", self.replicas.step, CHECK_SECONDS, Kind.RESTARTABLE, stop=self._stop),
            # Tables for callers with a token, read ahead of them (services/api/snapshot.py, invariant 2).
            supervise.loop(API_REFRESH, context.snapshots.step, 0.0, Kind.RESTARTABLE, stop=self._stop),
        ]
        context.snapshots.threaded()
        if self.loop.listing is not None:
            self.loop.listing.threaded()
            self._threads.append(supervise.loop("shard-listing", self.loop.listing.step, 0.0, Kind.RESTARTABLE,
                                                stop=self._stop))
        supervise.watch()

    def _leaders_snapshot(self, fresh: bool) -> ApiSnapshot | None:
        url = self.lock.holder_url()
        return None if url is None else self.peers.snapshot(url, self.lock.holder_id(), fresh)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop, release the lock so a successor takes over immediately, close the store."""
        self._stop.set()
        self.supervisor.stop()
        for thread in self._threads:
            thread.join(timeout)
        self.loop.feed.stand_down()  # agents waiting on this replica turn to the store (or another replica) at once
        self.loop.close()
        self.lock.release()
        if self.api is not None:
            self.api.stop(timeout)
        self.peers.close()
        self.store.close()

    def request_stop(self) -> None:
        """Ask `wait()` to return (safe from a signal handler)."""
        self._stop.set()

    def wait(self) -> None:
        """Block until stop() is called (e.g. by the SIGTERM handler).

        Waits in slices so the handler of a signal delivered to another thread runs at once in the main thread.
        """
        while not self._stop.wait(0.2):
            pass


def _let_go(lock: LeaderLock, clock: Clock) -> None:
    """Before the process exits on a failed or stalled critical thread: release the lock, trying for a second."""
    with retry_deadline(clock.monotonic() + GIVE_UP_SECONDS):
        lock.release(math.inf)


def register(sub: Any) -> None:
    """Add the `coordinator` subcommand."""
    parser = sub.add_parser("coordinator", help="run a coordinator replica (leader election, shard sync, assignment)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT; on either, release leadership at once so another replica takes over."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per probe of the leader (every 1.5 s) otherwise
    service = CoordinatorService.build(load_settings())

    def _terminate(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        service.request_stop()

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    service.start()
    log.info("coordinator %s running (application %s)", service.settings.worker_id, service.settings.application_name)
    service.wait()
    service.stop()
    return 0
