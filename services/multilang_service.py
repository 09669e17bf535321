"""`shardherd multilang --properties app.properties`: a KCL MultiLang application run by a shardherd agent.

`MultiLangDaemon(path)` reads the properties file and builds a shardherd agent (leases, discovery, hand-offs,
checkpoints and reads as any agent) whose processor factory starts the executable once per shard it holds. With
`coordinator` (the default, as every KCL worker may lead) the process also runs a coordinator replica, so a fleet of
`shardherd multilang` processes needs nothing else; without it, the agent follows the coordinator fleet named by
SHARDHERD_COORDINATOR_URL. Settings not in the properties file come from SHARDHERD_* variables as for any agent.

Invariants: the coordinator starts before the agent (it creates the tables) and stops after it (the agent's drain
needs a leader to hand its leases on); stop() drains unless told not to, so every child gets shutdownRequested and
its checkpoint is the hand-off checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

from shardherd.agent.heap import limit_malloc_arenas
from shardherd.agent.multilang.bridge import ChildOptions, MultiLangProcessor
from shardherd.agent.multilang.properties import MultiLangConfig, load_multilang_config
from shardherd.agent.read_spec import ReadLimits
from shardherd.agent.runtime import Agent
from shardherd.services.agent_service import StopSignals
from shardherd.services.coordinator_service import CoordinatorService
from shardherd.shared.config import Settings, load_settings

log = logging.getLogger(__name__)

EXIT_GRACE_SECONDS = 10.0  # a child's time to exit at end of its input when timeoutInSeconds is unset


def read_limits(config: MultiLangConfig) -> ReadLimits:
    """The reader's limits from maxRecords and idleTimeBetweenReadsInMillis (shardherd's defaults where unset)."""
    defaults = ReadLimits()
    idle = config.idle_between_reads
    return ReadLimits(
        records_per_call=config.records_per_call or defaults.records_per_call,
        min_call_interval=defaults.min_call_interval if idle is None else idle,
        idle_backoff=defaults.idle_backoff if idle is None else idle,
    )


def child_options(config: MultiLangConfig) -> ChildOptions:
    """How the bridge runs and talks to the executable."""
    return ChildOptions(command=config.command, workdir=config.workdir, timeout=config.timeout_seconds,
                        call_for_empty=config.call_process_records_for_empty,
                        exit_grace=config.timeout_seconds or EXIT_GRACE_SECONDS)


class MultiLangDaemon:
    """The library entry point: `MultiLangDaemon(Path("app.properties")).start()`, later `stop()`."""

    def __init__(self, properties: Path, coordinator: bool = True) -> None:
        limit_malloc_arenas()  # before any thread starts (agent/heap.py)
        self.config = load_multilang_config(properties)
        if self.config.profile:
            os.environ["AWS_PROFILE"] = self.config.profile  # ProfileCredentialsProvider|name: boto3 reads it
        for key, reason in sorted(self.config.ignored.items()):
            log.warning("properties: %s is ignored: %s", key, reason)
        self.settings: Settings = load_settings(**self.config.settings)
        self.coordinator: CoordinatorService | None = None
        if coordinator:
            self.coordinator = CoordinatorService.build(
                self.settings.model_copy(update={"worker_id": f"{self.settings.worker_id}-coordinator"}))
        options = child_options(self.config)
        # Read-ahead, as KCL's polling does: a child's round trip per batch (checkpoint included) overlaps the next
        # GetRecords call instead of adding to it.
        self.agent = Agent(self.settings, lambda: MultiLangProcessor(options), limits=read_limits(self.config),
                           prefetch=True)

    @property
    def drain_timeout(self) -> float | None:
        """The drain's limit: shutdownGraceMillis (None: the agent's derived default)."""
        grace = self.config.shutdown_grace_millis
        return grace / 1000 if grace else None

    def start(self) -> MultiLangDaemon:
        """Start the coordinator replica (if any), then the agent."""
        if self.coordinator is not None:
            self.coordinator.start()
        self.agent.start()
        log.info("multilang: %s on stream %s as %s, running %s per shard", self.settings.application_name,
                 self.settings.stream_name, self.settings.worker_id, " ".join(self.config.command))
        return self

    def stop(self, drain: bool = True) -> None:
        """Stop the agent (draining: children checkpoint on shutdownRequested), then the coordinator replica."""
        if not self.agent.stopped.is_set():  # it may have drained itself (its health port's POST /drain)
            self.agent.stop(drain=drain, drain_timeout=self.drain_timeout)
        if self.coordinator is not None:
            self.coordinator.stop()


def register(sub: Any) -> None:
    """Add the `multilang` subcommand."""
    parser = sub.add_parser("multilang", help="run a KCL MultiLang application (amazon-kclpy...) from its properties")
    parser.add_argument("--properties", required=True, type=Path, help="the MultiLangDaemon .properties file")
    parser.add_argument("--no-coordinator", action="store_true",
                        help="do not run a coordinator replica here (follow SHARDHERD_COORDINATOR_URL's)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT (drain: children checkpoint on shutdownRequested) or SIGUSR1 (no drain)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    daemon = MultiLangDaemon(args.properties, coordinator=not args.no_coordinator)
    signals = StopSignals(daemon.agent.begin_stop).install()
    daemon.start()
    signals.wait(daemon.agent.stopped)
    daemon.stop(drain=signals.drain)
    return 0
