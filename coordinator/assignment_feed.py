"""What the leader tells agents about their assignments: a version per worker, bumped when its leases change.

Agents long-poll the coordinator (`GET /v1/workers/{id}/assignments/changes`) instead of querying the owner index
every second: one eventually consistent Query per agent per second costs more read units than a whole KCL fleet's
reads (docs/store-cost.md). The leader feeds every run's lease view (its scan with its own writes applied) into an
`AssignmentFeed`; a worker's version moves when the set of leases it owns, receives or hands off changes, and the
waiting request returns at once with the worker's leases as the leader sees them. The agent still reads each lease
it starts or stops from the store (strongly consistent), so a stale or wrong answer can delay a pickup but never
make a worker process a lease it does not own.

A feed is named by the leader's epoch and a random nonce: versions of different terms or replicas are never compared.
What a position holds, and how a lease relates to a worker, is the channel's protocol (shared/assignment_channel.py).

The feed also tells the leader who is listening (docs/decisions/0010-leader-scans.md): an agent counts as on the
channel while a request of it waits here or its last one ended within `REPOLL_GRACE_SECONDS` (the watch asks again at
once). A worker joining, a waiting request dropped by its client (a killed agent's socket closes at once) and an
agent's news (it announced a drain, gave leases back or reached a shard's end) are signals: the leader scans the
store at its next tick instead of waiting for its full-scan cadence.

A waiting request proves little by itself: the socket of a frozen agent (SIGSTOP, a long GC pause, a VM paused)
stays open, so its request would count as presence for as long as it waits and the leader would never look at the
agent's row. A listening request therefore waits at most `hold` seconds (the agents' heartbeat period) whatever wait
it asked for; the watch asks again at once, so a live agent starts a request at least every `hold` seconds, and a
frozen one is off the channel within `hold + REPOLL_GRACE_SECONDS` (its row then decides, docs/failure-model.md).
Likewise an agent that listens but no longer heartbeats (its store calls hang or fail while the coordinator answers):
once the row its requests name stayed the same for `hold + REPOLL_GRACE_SECONDS` it is off the channel, so the
leader scans and fails it over like any silent worker (the fault matrix's "DynamoDB hang, agent": its leases were
never moved while its long-polls went on).

An agent's request also names the worker row it last wrote (`hb`, `lut`): `report_beat` keeps, per worker, the
newest such row and when a request first named it. That time comes after the row's write was sent, so the leader may
count the row as unchanged since then (coordinator/liveness.py): its verdicts and the sightings it publishes for a
successor stay as fresh as the channel, not as old as its last scan.

Invariants on load (docs/decisions/0021-api-credentials-and-load.md): only a request with a valid token is presence
or a signal (the API passes `listen=False` for anonymous ones), so an anonymous caller never makes the leader scan;
and signals wake the leader early at most once per `wake_gap` seconds (its assignment interval): whatever token
holders send, signal-driven scans stay within about two per interval, and a signal in between waits for the next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from shardherd.shared.assignment_channel import FeedPosition, relations
from shardherd.shared.clock import Clock, SystemClock
from shardherd.shared.lease import Lease

# Signals: a worker's first request here, a waiting request its client dropped, an agent's news (see `signal`).
JOINED = "joined"
DROPPED = "dropped"
NEWS = "news"

REPOLL_GRACE_SECONDS = 2.0  # the watch asks again at once after an answer; longer without a request: off the channel
FORGET_SECONDS = 3600.0  # a worker without a request for this long is forgotten (its next one is a JOINED again)


class NotLeading(Exception):
    """Raised when the replica does not lead (any more): the agent asks another replica or polls the store."""


_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


@dataclass(slots=True)
class _Presence:
    """A worker's requests to this replica: how many wait now, and when the last one ended (monotonic seconds)."""

    open: int = 0
    ended_at: float | None = None
    started_at: float | None = None  # when the newest request arrived


class AssignmentFeed:
    """Per-worker assignment versions of one leader replica; thread-safe, with asyncio long-poll waiting.

    Also who listens (`on_channel`) and what happened on the channel since the leader last looked (`take_signals`);
    `wakeup` is set while signals wait, so the leader loop can run at once.
    """

    def __init__(self, clock: Clock | None = None, wake_gap: float = 0.0, hold: float = math.inf) -> None:
        self._guard = threading.Lock()
        self._clock = clock or SystemClock()
        self._wake_gap = wake_gap
        self._hold = hold  # the longest a listening request waits here (see the module's docstring)
        self._woken_at: float | None = None
        self._name: str | None = None  # None while this replica does not lead
        self._versions: dict[str, int] = {}
        self._leases: dict[str, dict[str, str]] = {}
        self._waiters: dict[str, list[_Waiter]] = {}
        self._present: dict[str, _Presence] = {}
        self._signals: list[tuple[str, str]] = []  # (worker, JOINED | DROPPED | NEWS), oldest first
        self._beats: dict[str, tuple[int, int, float]] = {}  # worker -> (hb, lut, when a request first named it)
        self.fleet_stalls = False  # the latest full run's verdict on a fleet-wide stall (decision 0039)
        self.shard_stalls: frozenset[str] = frozenset()  # its shard-stalled leases (decision 0043)
        self.wakeup = threading.Event()

    # ------------------------------------------------------------------ who listens
    def connect(self, worker: str) -> None:
        """A request of `worker` arrived (its first one here is a JOINED signal)."""
        with self._guard:
            presence = self._present.get(worker)
            if presence is None:
                presence = self._present[worker] = _Presence()
                self._signal(worker, JOINED)
            presence.open += 1
            presence.started_at = self._clock.monotonic()

    def disconnect(self, worker: str, dropped: bool) -> None:
        """A request of `worker` ended: answered, or `dropped` by its client before the answer (a DROPPED signal)."""
        with self._guard:
            presence = self._present.setdefault(worker, _Presence())
            presence.open = max(0, presence.open - 1)
            presence.ended_at = self._clock.monotonic()
            if dropped:
                self._signal(worker, DROPPED)

    def report_beat(self, worker: str, heartbeat: int, last_update: int) -> None:
        """A request of `worker` says its last written row has this `hb` and `lut` (sent before the request)."""
        with self._guard:
            known = self._beats.get(worker)
            if known is None or known[:2] != (heartbeat, last_update):
                self._beats[worker] = (heartbeat, last_update, self._clock.monotonic())

    def beats(self) -> dict[str, tuple[int, int, float]]:
        """Worker -> (hb, lut, monotonic time a request first named that row) as the agents last reported."""
        with self._guard:
            return dict(self._beats)

    def signal(self, worker: str, kind: str) -> None:
        """Something the leader should look at now (an agent's news, or a connection event)."""
        with self._guard:
            self._signal(worker, kind)

    def _signal(self, worker: str, kind: str) -> None:
        self._signals.append((worker, kind))
        now = self._clock.monotonic()
        if self._woken_at is None or now - self._woken_at >= self._wake_gap:
            self._woken_at = now
            self.wakeup.set()

    def take_signals(self) -> list[tuple[str, str]]:
        """The signals since the last call, oldest first (the leader takes them at each tick)."""
        with self._guard:
            taken, self._signals = self._signals, []
            self.wakeup.clear()
            now = self._clock.monotonic()
            gone = [worker for worker, presence in self._present.items() if presence.open == 0
                    and presence.ended_at is not None and now - presence.ended_at > FORGET_SECONDS]
            for worker in gone:
                del self._present[worker]
                self._beats.pop(worker, None)
        return taken

    def on_channel(self, worker: str) -> bool:
        """True while a fresh request of `worker` waits here, or its last one ended within REPOLL_GRACE_SECONDS.

        Fresh: the newest request arrived within `hold` plus REPOLL_GRACE_SECONDS (a frozen agent's stays open). And
        a worker whose requests name a row is off the channel once they named the same row for that long (it listens
        but does not heartbeat).
        """
        with self._guard:
            presence = self._present.get(worker)
            if presence is None:
                return False
            now = self._clock.monotonic()
            beat = self._beats.get(worker)
            if beat is not None and now - beat[2] > self._hold + REPOLL_GRACE_SECONDS:
                return False
            if presence.open > 0 and presence.started_at is not None:
                return now - presence.started_at <= self._hold + REPOLL_GRACE_SECONDS
            return presence.ended_at is not None and now - presence.ended_at <= REPOLL_GRACE_SECONDS

    def observe(self, epoch: int, leases: Iterable[Lease], fleet_stalls: bool = False,
                shard_stalls: frozenset[str] = frozenset()) -> None:
        """A leader run's lease view (its writes applied): bump and wake every worker whose leases changed.

        `fleet_stalls` is the run's verdict on a fleet-wide stall (coordinator/fleet_stall.py), `shard_stalls` the
        leases whose reads stalled at two workers or more (coordinator/shard_stall.py): every position answered from
        now on carries them (a worker's position only its own shard-stalled leases). When the fleet's verdict turns,
        every listener is answered at once, and when a worker's shard-stalled leases change, that worker (no version
        moves): agents hear a verdict before their sooner give-back of failing reads (agent/stall_watch.py,
        invariant 4).
        """
        current = relations(leases)
        with self._guard:
            turned = fleet_stalls != self.fleet_stalls
            before = {worker: _stalled_of(self.shard_stalls, mine) for worker, mine in self._leases.items()}
            self.fleet_stalls, self.shard_stalls = fleet_stalls, shard_stalls
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
            if turned:
                changed = set(self._waiters)
            changed |= {worker for worker, mine in current.items()
                        if _stalled_of(shard_stalls, mine) != before.get(worker, frozenset())}
            woken = [waiter for worker in changed for waiter in self._waiters.pop(worker, [])]
        _wake(woken)

    def stand_down(self) -> None:
        """The replica stopped leading: every waiting request returns (as not leading)."""
        with self._guard:
            self._name = None
            self.fleet_stalls, self.shard_stalls = False, frozenset()
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
        mine = self._leases.get(worker, {})
        return FeedPosition(self._name, self._versions.get(worker, 0), dict(mine), self.fleet_stalls,
                            _stalled_of(self.shard_stalls, mine))

    async def wait(self, worker: str, feed: str | None, after: int, timeout: float,
                   listen: bool = True) -> FeedPosition:
        """The worker's position once it moves past (`feed`, `after`), or after `timeout` seconds unchanged.

        With `listen` the request counts as the worker's presence on the channel (and waits at most `hold` seconds);
        cancelled (its client went away), as dropped. Without it (an anonymous caller) it is neither: nothing is
        remembered and nothing signalled.
        """
        if not listen:
            return await self._wait(worker, feed, after, timeout)
        self.connect(worker)
        dropped = False
        try:
            return await self._wait(worker, feed, after, min(timeout, self._hold))
        except asyncio.CancelledError:
            dropped = True
            raise
        finally:
            self.disconnect(worker, dropped)

    async def _wait(self, worker: str, feed: str | None, after: int, timeout: float) -> FeedPosition:
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
            pass
        finally:  # timed out or cancelled: this request no longer waits
            with self._guard:
                waiters = self._waiters.get(worker, [])
                if (loop, future) in waiters:
                    waiters.remove((loop, future))
                if not waiters:
                    self._waiters.pop(worker, None)
        return self.position(worker)


def _stalled_of(shard_stalls: frozenset[str], leases: dict[str, str]) -> frozenset[str]:
    """The shard-stalled leases among a worker's (a compact answer: only the leases it holds or receives)."""
    return frozenset(key for key in leases if key in shard_stalls) if shard_stalls else frozenset()


def _wake(waiters: list[_Waiter]) -> None:
    for loop, future in waiters:
        with contextlib.suppress(RuntimeError):  # a closed server loop: nobody waits there any more
            loop.call_soon_threadsafe(_settle, future)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
