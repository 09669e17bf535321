"""An agent process's stop signals: the first one decides, even when a second arrives while its handler runs.

The local stack stops its agents with SIGUSR1 (no drain) and closes their stdin at once, so each agent's parent-death
watcher sends SIGTERM (drain) a moment later. CPython may run that handler nested inside the first one; CI once saw an
agent drain on a fleet stop that way. These tests send real signals to this process.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator

import pytest

from shardherd.services.agent_service import StopSignals

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


@pytest.fixture
def restored_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in HANDLED}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


class _SignalWhileLogging(logging.Handler):
    """Sends `sig` to this process while the first handler logs its decision, so the second handler runs nested."""

    def __init__(self, sig: signal.Signals) -> None:
        super().__init__()
        self.sig = sig
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if len(self.messages) == 1:
            os.kill(os.getpid(), self.sig)


@pytest.mark.parametrize(("first", "second", "drains"), [(signal.SIGUSR1, signal.SIGTERM, False),
                                                        (signal.SIGTERM, signal.SIGUSR1, True)])
def test_a_signal_arriving_inside_the_first_handler_changes_nothing(
        restored_handlers: None, first: signal.Signals, second: signal.Signals, drains: bool) -> None:
    drains_begun: list[bool] = []
    signals = StopSignals(lambda: drains_begun.append(True)).install()
    probe = _SignalWhileLogging(second)
    logger = logging.getLogger("shardherd.services.agent_service")
    logger.addHandler(probe)
    previous_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        os.kill(os.getpid(), first)
        signals.wait()
        for _ in range(1000):  # a few more bytecodes: any handler still pending runs here
            pass
    finally:
        logger.removeHandler(probe)
        logger.setLevel(previous_level)
    assert signals.drain is drains
    assert drains_begun == ([True] if drains else [])
    assert len(probe.messages) == 1, probe.messages  # the second signal was handled and ignored
    assert probe.messages[0] == f"signal {int(first)}: {'draining' if drains else 'stopping with the fleet, no drain'}"
