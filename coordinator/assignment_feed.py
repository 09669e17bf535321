"""What the leader tells agents about their assignments: a version per worker, bumped when its leases change.

Agents long-poll the coordinator (`GET /v1/workers/{id}/assignments/changes`) instead of querying the owner index
every second: one eventually consistent Query per agent per second costs more read units than a whole KCL fleet's
reads (docs/store-cost.md). The leader feeds every run's lease view (its scan with its own writes applied) into an
`AssignmentFeed`; a worker's version moves when the set of leases it owns, receives or hands off changes, and the
waiting request returns at once with the worker's leases as the leader sees them. The agent still reads each lease
it starts or stops from the store (strongly consistent), so a stale or wrong answer can delay a pickup but never
make a worker process a lease it does not own.

A feed is named by the leader's epoch and a random nonce: versions of different terms or replicas are never compared.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from shardherd.shared.lease import Lease

# A lease's relation to a worker: it owns and processes it, receives it (handoff running), or hands it off.
OWNS = "owns"
RECEIVES = "receives"
HANDS_OFF = "hands_off"


@dataclass(frozen=True, slots=True)
class FeedPosition:
    """A worker's place in a feed: the feed's name, the worker's version and its leases (key -> relation)."""

    feed: str
    version: int
    leases: dict[str, str]


def relations(leases: Iterable[Lease]) -> dict[str, dict[str, str]]:
    """Worker -> (lease key -> relation) for every lease that names the worker as owner or checkpoint owner."""
    result: dict[str, dict[str, str]] = {}
    for lease in leases:
        if lease.checkpoint_owner is not None:
            result.setdefault(lease.checkpoint_owner, {})[lease.lease_key] = HANDS_OFF
            if lease.lease_owner is not None and lease.lease_owner != lease.checkpoint_owner:
                result.setdefault(lease.lease_owner, {})[lease.lease_key] = RECEIVES
        elif lease.lease_owner is not None:
            result.setdefault(lease.lease_owner, {})[lease.lease_key] = OWNS
    return result


class NotLeading(Exception):
    """Raised when the replica does not lead (any more): the agent asks another replica or polls the store."""


_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class AssignmentFeed:
    """Per-worker assignment versions of one leader replica; thread-safe, with asyncio long-poll waiting."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._name: str | None = None  # None while this replica does not lead
        self._versions: dict[str, int] = {}
        self._leases: dict[str, dict[str, str]] = {}
        self._waiters: dict[str, list[_Waiter]] = {}

    def observe(self, epoch: int, leases: Iterable[Lease]) -> None:
        """A leader run's lease view (its writes applied): bump and wake every worker whose leases changed."""
        current = relations(leases)
        with self._guard:
            if self._name is None or not self._name.startswith(f"{epoch}-"):
                self._name = f"{epoch}-{secrets.token_hex(4)}"
                self._versions, self._leases = {}, {}
                changed = set(self._waiters)
            else:
                changed = {worker for worker in current.keys() | self._leases.keys()
                           if current.get(worker, {}) != self._leases.get(worker, {})}
            self._leases = current
            for worker in changed:
                self._versions[worker] = self._versions.get(worker, 0) + 1
            woken = [waiter for worker in changed for waiter in self._waiters.pop(worker, [])]
        _wake(woken)

    def stand_down(self) -> None:
        """The replica stopped leading: every waiting request returns (as not leading)."""
        with self._guard:
            self._name = None
            woken = [waiter for waiters in self._waiters.values() for waiter in waiters]
            self._waiters = {}
        _wake(woken)

    def position(self, worker: str) -> FeedPosition:
        """The worker's current position; NotLeading if this replica does not lead."""
        with self._guard:
            return self._position(worker)

    def _position(self, worker: str) -> FeedPosition:
        if self._name is None:
            raise NotLeading()
        return FeedPosition(self._name, self._versions.get(worker, 0), dict(self._leases.get(worker, {})))

    async def wait(self, worker: str, feed: str | None, after: int, timeout: float) -> FeedPosition:
        """The worker's position once it moves past (`feed`, `after`), or after `timeout` seconds unchanged."""
        loop = asyncio.get_running_loop()
        with self._guard:
            now = self._position(worker)
            if now.feed != feed or now.version > after:
                return now
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(worker, []).append((loop, future))
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            with self._guard:
                waiters = self._waiters.get(worker, [])
                if (loop, future) in waiters:
                    waiters.remove((loop, future))
                if not waiters:
                    self._waiters.pop(worker, None)
        return self.position(worker)


def _wake(waiters: list[_Waiter]) -> None:
    for loop, future in waiters:
        with contextlib.suppress(RuntimeError):  # a closed server loop: nobody waits there any more
            loop.call_soon_threadsafe(_settle, future)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
