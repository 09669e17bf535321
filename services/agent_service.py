"""`shardherd agent --processor module:Class`: run a plain agent with a user's record processor until SIGTERM."""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import threading
from types import FrameType
from typing import Any

from agent.consumer import RecordProcessor
from agent.runtime import Agent
from agent.shard_worker import ProcessorFactory
from shared.config import load_settings
from shared.errors import ConfigError

log = logging.getLogger(__name__)


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


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT, then drain: leases move to other workers with their checkpoints."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    factory = load_processor(args.processor)
    agent = Agent(load_settings(), factory)

    def _terminate(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: draining", signum)
        agent.keeper.begin_drain()
        stopping.set()

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    agent.start()
    log.info("agent %s running on stream %s", agent.settings.worker_id, agent.settings.stream_name)
    stopping.wait()
    agent.stop(drain=True, drain_timeout=args.drain_timeout)
    return 0
