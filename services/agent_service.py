"""`shardherd agent --processor module:Class`: run a plain agent with a user's record processor until SIGTERM."""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from shardherd.agent.consumer import RecordProcessor
from shardherd.agent.heap import limit_malloc_arenas
from shardherd.agent.runtime import Agent
from shardherd.agent.shard_worker import ProcessorFactory
from shardherd.shared.config import load_settings
from shardherd.shared.errors import ConfigError

log = logging.getLogger(__name__)

SIGNAL_POLL_SECONDS = 0.2


def load_processor(spec: str) -> ProcessorFactory:
    """Import `module:Class` and check it is a RecordProcessor subclass (a clear ConfigError otherwise)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"--processor must look like module:Class, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--processor {spec}: cannot import {module_name}: {exc}") from exc
    target = getattr(module, attribute, None)
    if not (isinstance(target, type) and issubclass(target, RecordProcessor)):
        raise ConfigError(f"--processor {spec}: {attribute} is not a RecordProcessor subclass in {module_name}")
    return target


def register(sub: Any) -> None:
    """Add the `agent` subcommand."""
    parser = sub.add_parser("agent", help="run a worker agent with a record processor")
    parser.add_argument("--processor", required=True, help="module:Class of a RecordProcessor subclass")
    parser.add_argument("--drain-timeout", type=float, default=None,
                        help="seconds to wait on SIGTERM for the leader to move leases away (default: derived)")
    parser.set_defaults(run=run)


class StopSignals:
    """How the process was asked to stop; the first signal decides.

    SIGTERM/SIGINT: drain (the leader hands the leases to the other workers first). SIGUSR1: the whole fleet stops,
    nobody can take the leases: checkpoint and give them back at once (no wait, no warning).
    """

    def __init__(self, on_drain: Callable[[], None] | None = None) -> None:
        self.stopping = threading.Event()
        self.drain = True
        self._on_drain = on_drain
        self._unclaimed = [True]  # popped by the first signal's handler: one C call, so no second handler interleaves

    def install(self) -> StopSignals:
        """Install the handlers (main thread only)."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self._handle)
        return self

    def wait(self, ended: threading.Event | None = None) -> None:
        """Block until a stop signal came (or `ended` is set: the agent drained itself through its health port).

        Waits in slices: a signal delivered to another thread does not wake a main thread blocked without a timeout,
        so its handler would run only when something else woke that thread.
        """
        while not self.stopping.wait(SIGNAL_POLL_SECONDS):
            if ended is not None and ended.is_set():
                return

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # A second signal's handler can run nested inside this one, between any two of its bytecodes (the stack's
        # SIGUSR1 is followed at once by the parent-death watcher's SIGTERM): only the handler that claims decides.
        try:
            self._unclaimed.pop()
        except IndexError:
            return
        self.drain = signum != signal.SIGUSR1
        log.info("signal %d: %s", signum, "draining" if self.drain else "stopping with the fleet, no drain")
        if self.drain and self._on_drain is not None:
            self._on_drain()
        self.stopping.set()


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT (drain: leases move to other workers with their checkpoints) or SIGUSR1 (no drain)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    limit_malloc_arenas()  # before the agent's threads start (agent/heap.py)
    factory = load_processor(args.processor)
    agent = Agent(load_settings(), factory)
    signals = StopSignals(agent.begin_stop).install()
    agent.start()
    log.info("agent %s running on stream(s) %s", agent.settings.worker_id, ", ".join(agent.settings.stream_names))
    signals.wait(agent.stopped)
    if not agent.stopped.is_set():
        agent.stop(drain=signals.drain, drain_timeout=args.drain_timeout)
    return 0
