"""Wiring of one coordinator replica: store, leader lock keeper, leader loop, and the operator API."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from shardherd.coordinator.leader_lock import LeaderLock, LockKeeper
from shardherd.coordinator.leader_loop import LeaderLoop, ShardSource
from shardherd.coordinator.run_summary import RunSummary
from shardherd.coordinator.stream_source import MultiStreamSource
from shardherd.services.api import ApiContext, ApiServer, create_app
from shardherd.services.api.auth import ApiTokens
from shardherd.services.api.snapshot import ApiSnapshot
from shardherd.services.leader_status import LeaderWatch
from shardherd.services.peer_client import PeerClient
from shardherd.services.replicas import ReplicaReporter
from shardherd.shared.aws import make_client
from shardherd.shared.clock import Clock, SystemClock
from shardherd.shared.config import Settings, load_settings
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.shard_lister import list_shards
from shardherd.shared.shards import Shard
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_factory import open_store

log = logging.getLogger(__name__)


def kinesis_shard_source(settings: Settings, clock: Clock) -> ShardSource | None:
    """A ListShards-backed shard source for the configured stream(s), or None when no stream is configured."""
    stream = settings.stream_name
    if stream is None and not settings.streams:
        return None
    client = make_client("kinesis", settings.region, settings.kinesis_endpoint_url)
    retry = RetryPolicy(clock=clock)
    if stream is None:
        return MultiStreamSource(client, settings.streams, retry)

    def source() -> list[Shard]:
        return list_shards(client, stream, retry)

    return source


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
    api: ApiServer | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def build(cls, settings: Settings, clock: Clock | None = None) -> CoordinatorService:
        """Open the store (creating tables if needed) and construct the lock and the loop."""
        clock = clock or SystemClock()
        store = open_store(settings, RetryPolicy(clock=clock), caller="coordinator")
        store.ensure_tables()
        watch = LeaderWatch(store, settings.worker_id, clock)
        peers = PeerClient(ApiTokens.from_settings(settings).for_peers())
        lock = LeaderLock(store, settings.worker_id, clock, settings.leader_lock_lease_duration_millis,
                          settings.leader_lock_heartbeat_period_millis, on_change=watch.on_lock_change,
                          last_success=watch.last_success_wall, holder_probe=peers.hold)
        replicas = ReplicaReporter(store, settings.worker_id, clock, lambda: (lock.is_leader(), lock.epoch()))

        def on_run(summary: RunSummary) -> None:
            replicas.note_run(summary)
            watch.on_run(summary)

        loop = LeaderLoop(store, lock, settings, clock, kinesis_shard_source(settings, clock), on_run=on_run)
        return cls(settings, store, lock, loop, clock, watch, replicas, peers)

    def start(self) -> None:
        """Start the operator API (on api_host:api_port; `api.port` is the bound one), the lock keeper and the loop."""
        context = ApiContext(self.settings, self.store, self.lock, self.loop, self.watch, self.clock,
                             from_leader=self._leaders_snapshot)
        self.api = ApiServer(create_app(context), self.settings.api_host, self.settings.api_port).start()
        url = self.settings.api_advertise_url or self.api.url
        self.replicas.set_api_url(url)
        self.lock.set_api_url(url)
        keeper = LockKeeper(self.lock, self.settings.leader_lock_heartbeat_period_millis / 1000 / 3, self.clock)
        runner = threading.Thread(target=self.loop.run_forever, args=(self._stop,), name="leader-loop", daemon=True)
        reporter = threading.Thread(target=self.replicas.run, args=(self._stop,), name="replica-report", daemon=True)
        self._threads = [keeper, runner, reporter]
        keeper.start()
        runner.start()
        reporter.start()

    def _leaders_snapshot(self) -> ApiSnapshot | None:
        url = self.lock.holder_url()
        return None if url is None else self.peers.snapshot(url, self.lock.holder_id())

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop, release the lock so a successor takes over immediately, close the store."""
        self._stop.set()
        keeper = self._threads[0] if self._threads else None
        if isinstance(keeper, LockKeeper):
            keeper.stop()
        for thread in self._threads:
            thread.join(timeout)
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
