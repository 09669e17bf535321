"""Held leases whose reading makes no progress: health turns red, then the lease is given back (issue 30).

Invariants:
1. Every lease the keeper holds in PROCESSING state is watched from the moment it is first seen; its reader (a plain
   agent's shard worker thread, a Spark driver's probes and its query) reports progress with `progressed(key)`: a
   read that answered, a batch delivered, a backoff step of a retry policy it is following, and for a Spark shard
   whose records wait for the next batch the query's own progress (agent/spark/query_watch.py, reported with the
   time it happened). Nothing else counts.
2. A lease is *stalled* once its reader made no progress for `red_after` (3 heartbeat intervals): /healthz is red
   while one is (`problem`), and /metrics lists it.
3. A stalled lease is given back (released, reported as refused so the leader gives it to another worker) once its
   reader cannot be restarted (it says it is not running: its thread is dead or waiting for a restart); once its
   reads only *failed* since its last progress (at red, `red_after`); or once it made none for
   `give_up_after` (red_after + 3 failover times), whatever its reader does. A read *failed* when it got no answer
   but a refusal or hit its deadline: credentials rejected or not refreshed (ExpiredToken), a malformed body, a 5xx,
   throttling, a connection refused or timed out (the reader reports it with `failed(key, why)`; the agent's Kinesis
   calls have a deadline, agent/read_deadline.py). Such a fault is this worker's (its network, its credentials, its
   proxy), passes, or is shared: a shared one is for the leader's verdicts (invariant 4), which the early reports of
   invariant 5 let arrive before red. A reader whose call is merely in flight is *slow*: the generous bound, since a
   first read from TRIM_HORIZON on a loaded host must not cost a lease.
   No process holds a lease for work it is not doing; one given back is counted (`given_up`).
4. Except in a fleet-wide stall (decision 0039): while the leader's fresh verdict says most lease-holding workers
   stall at once (coordinator/fleet_stall.py, heard on the assignment channel: `FleetVerdict`), a stalled lease whose
   reader still runs is *held*: kept past its give-up bound (its reader keeps retrying with its backoff) and not a
   health problem (restarting every pod brings no shared outage back; /metrics still lists the lease). A reader that
   is not running is still given back at once. A verdict older than `red_after`, or none (no coordinator, channel
   down), is no verdict: invariant 3 holds, counting the give-up span after red (3 failover times) from the last
   fresh word that the fleet stalls as well. So a leader change (no answer for a few seconds), or a verdict that
   turns for a moment (one worker's leases fenced and handed on, not yet stalled again), does not give back at once
   every lease an outage has kept long past its bound. Nor does red come the moment the word ends: a lease kept
   for it stays held (health green) for `red_after` after its last fresh word, the time it has to read again, as
   after progress (at a heal the leader's verdict turns once most workers read again, and a reader whose hung call
   the heal ended reads a second or two later: its agent flashed red, session 23). The give-back of failing reads
   at red leaves the verdict the 1-2 heartbeat intervals after the reports of invariant 5 to arrive (the row is
   written at once, the leader runs on the news, the feed wakes listeners when its verdict turns:
   coordinator/assignment_feed.py). It is a margin, not a proof: see decision 0026's amendments.
   The same holds per lease under the leader's per-lease verdict (decision 0043, coordinator/shard_stall.py): a
   lease whose reads stalled at two workers or more is the shard's fault (or the service's), not this worker's, and
   handing it round only pays a move per owner; while the leader's word that this lease is shard-stalled is fresh
   (heard with the same answers, `FleetVerdict.shard_stalls`), the lease is held like the fleet's, its health green
   (restarting the pod cannot fix a shard), and a stale word counts the same give-up span from its last fresh
   word, per lease. A reader that is not running is still given back at once, and so is a lease whose reads failed
   on this worker's own credentials since its last progress (rejected or none to be had: `failed(key, why,
   own=True)`): that fault is the worker's, whoever else stalled on the lease.
5. What the worker row reports as stalled (`stalled_keys`, counted by the leader's verdicts): the held leases the
   last `check()` did not give back whose reader made no progress for `fail_report_after` (1 heartbeat interval)
   while its reads only failed, or for `report_after` (2) whatever it does. `on_report` is told when one is added,
   so the row is written at once, not at the next heartbeat.
6. Pure bookkeeping on an injected clock; the caller runs `check()` on a supervised loop and owns the give-back.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from shardherd.shared.clock import Clock
from shardherd.shared.stall_bounds import StallBounds

log = logging.getLogger(__name__)

class Verdict(enum.Enum):
    """What a held lease's progress calls for."""

    OK = "ok"
    STALLED = "stalled"  # health red
    HELD = "held"  # stalled with the fleet, or at every owner: kept, health green (invariant 4)
    GIVE_UP = "give_up"  # given back


def verdict(since_progress: float, running: bool, bounds: StallBounds, kept: bool = False,
            since_kept: float = math.inf, failing: bool = False) -> Verdict:
    """The rule of invariants 2 to 4 for one lease.

    `kept`: a fresh verdict of the leader says the fleet stalls now, or that this lease stalls at every owner;
    `since_kept`: seconds since such a word last did (a lease stays held for `red_after` after it, and is given back
    only once that is longer than the give-up span after red as well); `failing`: the lease's reads only failed
    since its last progress.
    """
    if since_progress <= bounds.red_after:
        return Verdict.OK
    if not running:
        return Verdict.GIVE_UP
    if kept or since_kept <= bounds.red_after:  # a kept lease's red bound counts from the end of the word (no flash)
        return Verdict.HELD
    if (failing or since_progress > bounds.give_up_after) and since_kept > bounds.give_up_after - bounds.red_after:
        return Verdict.GIVE_UP
    return Verdict.STALLED


class FleetVerdict:
    """The leader's last word on stalls, as the assignment channel brought it; heeded only while fresh.

    Fleet-wide (`__call__`, decision 0039) and per lease (`shard_stalls`, decision 0043). The channel answers a
    listening agent at least once per heartbeat period while it works (the leader holds a request at most that long,
    coordinator/assignment_feed.py), so a word older than `fresh_for` (the red bound, 3 heartbeat intervals) means
    the coordinator or the channel is gone: no verdict, today's rule (invariant 4).
    """

    def __init__(self, clock: Clock, fresh_for: float) -> None:
        self._clock = clock
        self._fresh_for = fresh_for
        # (the fleet stalls, the shard-stalled leases of this worker, monotonic time heard)
        self._heard: tuple[bool, frozenset[str], float] | None = None

    def heard(self, fleet_stalls: bool, shard_stalls: Collection[str] = ()) -> None:
        """An answer of the leader said whether the fleet stalls, and which of this worker's leases stall anywhere."""
        self._heard = (fleet_stalls, frozenset(shard_stalls), self._clock.monotonic())

    def _fresh(self) -> tuple[bool, frozenset[str]]:
        heard = self._heard
        if heard is None or self._clock.monotonic() - heard[2] > self._fresh_for:
            return False, frozenset()
        return heard[0], heard[1]

    def __call__(self) -> bool:
        """True while the leader's word that the fleet stalls is fresh."""
        return self._fresh()[0]

    def shard_stalls(self) -> frozenset[str]:
        """The leases the leader's fresh word says stalled at two workers or more (none once the word is stale)."""
        return self._fresh()[1]


@dataclass(frozen=True, slots=True)
class Stalled:
    """A held lease past `red_after`, as health and /metrics show it."""

    lease_key: str
    seconds: float
    running: bool
    verdict: Verdict
    failure: str | None = None  # the last failed read's error while the reads only failed since the last progress
    shard_stalled: bool = False  # the leader's fresh word says this lease stalls at every owner (decision 0043)


class StallWatch:
    """Per held lease, when its reader last made progress; `check` gives back those past their bound."""

    def __init__(self, clock: Clock, bounds: StallBounds, held: Callable[[], Iterable[str]],
                 give_back: Callable[[str, str], None], running: Callable[[str], bool] | None = None,
                 fleet_stalls: Callable[[], bool] | None = None,
                 shard_stalls: Callable[[], frozenset[str]] | None = None,
                 on_report: Callable[[], None] | None = None) -> None:
        self._clock = clock
        self.bounds = bounds
        self._held = held
        self._give_back = give_back
        self._running = running or (lambda key: True)
        self.fleet_stalls = fleet_stalls or (lambda: False)  # the leader's fresh verdict (FleetVerdict)
        self.shard_stalls = shard_stalls or frozenset  # its fresh per-lease verdict (FleetVerdict.shard_stalls)
        self._on_report = on_report or (lambda: None)  # a lease was added to the report (invariant 5)
        self._last: dict[str, float] = {}
        self._failing: dict[str, str] = {}  # lease -> its last read's error, while reads only failed since progress
        self._own: set[str] = set()  # leases whose reads failed on this worker's credentials since progress
        self._guard = threading.Lock()
        self._reported: frozenset[str] = frozenset()  # reported stalled at the last check (invariant 5)
        self._holding: frozenset[str] = frozenset()  # held for a fleet-wide or shard-wide stall at the last check
        self._fleet_seen = -math.inf  # monotonic time of the last fresh word that the fleet stalls (invariant 4)
        self._shard_seen: dict[str, float] = {}  # per lease: the last fresh word that it stalls at every owner
        self.given_up = 0

    def progressed(self, lease_key: str, at: float | None = None) -> None:
        """The lease's reader made progress now, or at monotonic time `at` (invariant 1); a clock never goes back."""
        when = self._clock.monotonic() if at is None else at
        with self._guard:
            self._last[lease_key] = max(when, self._last.get(lease_key, when))
            self._failing.pop(lease_key, None)
            self._own.discard(lease_key)

    def failed(self, lease_key: str, why: str, own: bool = False) -> None:
        """A read of the lease failed (invariant 3); `own`: on this worker's credentials (invariant 4)."""
        with self._guard:
            self._failing[lease_key] = why
            if own:
                self._own.add(lease_key)

    def _ages(self) -> tuple[float, list[tuple[str, float, str | None]]]:
        """Now, and per held lease: seconds since its progress and its last failed read's error while failing."""
        now = self._clock.monotonic()
        held = set(self._held())
        with self._guard:
            self._last = {key: self._last.get(key, now) for key in held}  # a lease first seen starts its clock
            self._failing = {key: why for key, why in self._failing.items() if key in held}
            self._own &= held
            return now, sorted((key, now - last, self._failing.get(key)) for key, last in self._last.items())

    def stalled(self) -> list[Stalled]:
        """The held leases past `red_after`, by key, each with its verdict."""
        return self._judge(*self._ages())

    def _judge(self, now: float, ages: list[tuple[str, float, str | None]]) -> list[Stalled]:
        """`stalled()` from the ages `_ages()` gave."""
        held = {key for key, _, _ in ages}
        with self._guard:
            own = frozenset(self._own)
        fleet, shards = self.fleet_stalls(), self.shard_stalls() - own
        if fleet:
            self._fleet_seen = max(self._fleet_seen, now)
        self._shard_seen = {key: at for key, at in self._shard_seen.items() if key in held}
        self._shard_seen.update((key, now) for key in shards if key in held)
        states = []
        for key, age, failure in ages:
            if age > self.bounds.red_after:
                running = self._running(key)
                since_kept = now - max(self._fleet_seen, self._shard_seen.get(key, -math.inf))
                rule = verdict(age, running, self.bounds, fleet or key in shards, since_kept, failure is not None)
                states.append(Stalled(key, age, running, rule, failure, key in shards))
        return states

    def stalled_keys(self) -> frozenset[str]:
        """The leases the last `check` reported stalled (the worker row carries them, invariant 5)."""
        return self._reported

    def check(self) -> None:
        """Give back every held lease whose verdict is GIVE_UP (one log line each); report the rest (invariant 5)."""
        now, ages = self._ages()
        states = self._judge(now, ages)
        bounds = self.bounds
        reported = frozenset(key for key, age, failure in ages
                             if age > (bounds.report_after if failure is None else bounds.fail_report_after))
        reported -= {state.lease_key for state in states if state.verdict is Verdict.GIVE_UP}
        added, self._reported = reported - self._reported, reported
        if added:
            self._on_report()
        self._note_holding(states)
        for state in states:
            if state.verdict is not Verdict.GIVE_UP:
                continue
            why = f"its reader made no progress for {state.seconds:.1f} s and " + _still(state)
            log.error("lease %s: %s; giving it back", state.lease_key, why)
            with self._guard:
                self._last.pop(state.lease_key, None)
                self._failing.pop(state.lease_key, None)
                self._own.discard(state.lease_key)
            self._give_back(state.lease_key, why)
            self.given_up += 1  # after the give-back's store writes: a reader of the counter sees the lease free

    def _note_holding(self, states: list[Stalled]) -> None:
        """One log line per lease when it starts being held for a fleet-wide or a shard-wide stall."""
        holding = {state.lease_key: state for state in states if state.verdict is Verdict.HELD}
        for key in sorted(holding.keys() - self._holding):
            why = ("its reads stalled at another worker too (the leader's verdict): the shard's fault, not this "
                   "worker's; kept, its reader retries (decision 0043)" if holding[key].shard_stalled else
                   "as for most workers (the leader's verdict): kept, its reader retries (decision 0039)")
            log.warning("lease %s: no progress, %s", key, why)
        self._holding = frozenset(holding)

    def held(self) -> list[Stalled]:
        """The stalled leases kept for the leader's verdict now, each saying whether it stalls at every owner."""
        return [state for state in self.stalled() if state.verdict is Verdict.HELD]

    def problem(self) -> str | None:
        """Why health is red for leases (None while every held lease progresses or is held for a verdict)."""
        stalled = [state for state in self.stalled() if state.verdict is not Verdict.HELD]
        if not stalled:
            return None
        return "; ".join(f"lease {state.lease_key} made no progress for {state.seconds:.1f} s (bound "
                         f"{self.bounds.red_after:.1f} s{'' if state.running else ', reader not running'})"
                         for state in stalled)


def _still(state: Stalled) -> str:
    """Why a lease given back had no progress, for its log line."""
    if not state.running:
        return "is not running (dead or waiting for a restart)"
    return "still has none" if state.failure is None else f"its reads only failed since (last: {state.failure})"
