"""Agents and coordinators of the local stack that exit on their own are started again, as Kubernetes would.

A Spark driver whose query fails (its JVM starved on a loaded host, say) or a coordinator that crashes stays gone
otherwise: its leases move to the other agents after the failover time and the stack runs on with one process
fewer until it is stopped. Each such child is started again under the same name, so an agent back within the
failover time renews its own leases. The delay doubles with each exit in a row (1, 2, 4 ... 30 s) and starts again
at 1 s once a child ran for a minute, so a child that cannot start does not spin. Children stopped on purpose (a
scenario's kill, the stack stopping) are not started again.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import dataclass

from shardherd.services.local_stack.supervisor import Child, Supervisor

FIRST_DELAY = 1.0  # seconds before the first start again
MAX_DELAY = 30.0
STEADY_RUN = 60.0  # a child that ran this long before exiting is no longer crash-looping: its delay starts over


@dataclass(frozen=True, slots=True)
class Pending:
    """A child that exited on its own, to be started again at `due` (monotonic seconds)."""

    child: Child
    due: float
    delay: float


class Restarts:
    """Schedules exited children of the given roles and starts them again when their delay has passed.

    The stack passes its agents' and coordinators' roles; the emulators it reports but does not start again.
    """

    def __init__(self, supervisor: Supervisor, roles: Collection[str]) -> None:
        self._supervisor = supervisor
        self._roles = frozenset(roles)
        self._clock = supervisor.clock
        self._pending: dict[str, Pending] = {}
        self._delays: dict[str, float] = {}  # the last delay per name, doubled while the name keeps crashing
        self._closed = False
        self._guard = threading.Lock()

    def exited(self, child: Child) -> Pending | None:
        """Schedule a child that exited on its own; None for roles that are not started again or a planned exit."""
        if child.role not in self._roles or child.expected_exit or child.alive:
            return None
        now = self._clock.monotonic()
        with self._guard:
            if self._closed:
                return None
            last = self._delays.get(child.name)
            ran = now - child.started
            delay = FIRST_DELAY if last is None or ran >= STEADY_RUN else min(MAX_DELAY, 2 * last)
            self._delays[child.name] = delay
            pending = self._pending[child.name] = Pending(child, now + delay, delay)
        return pending

    def start_due(self) -> list[Child]:
        """Start again every scheduled child whose delay has passed; the new children."""
        now = self._clock.monotonic()
        with self._guard:
            due = [p for p in self._pending.values() if p.due <= now]
            for pending in due:
                del self._pending[pending.child.name]
            return [self._supervisor.respawn(pending.child) for pending in due]

    def close(self) -> None:
        """Start nothing more and schedule nothing more (the stack is stopping)."""
        with self._guard:
            self._closed = True
            self._pending.clear()
