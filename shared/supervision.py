"""Supervision of every long-lived thread of a coordinator or agent process (decision 0022).

Invariants:
1. Every long-lived thread runs under a `Supervisor`: `loop` (a step repeated every interval) or `thread` (a body run
   once, e.g. one shard's worker). An exception never ends one silently: it is logged in one line and counted.
2. A RESTARTABLE thread whose step (or body) raises runs it again after a backoff that starts at one interval
   (`BASE_BACKOFF_SECONDS` at least) and doubles up to `MAX_BACKOFF_SECONDS`, measured from the end of the failed
   attempt; a step that completes resets it. Restarts are counted per name (`snapshot`, /metrics, health).
3. A CRITICAL loop whose step raises makes the process give up at once; one that completes no step for the larger
   of its `stall_after` bound and `give_up_floor` (GIVE_UP_FLOOR_SECONDS: a loaded host's slow store calls are not
   a hang) makes it give up then. Giving up happens once: `give_up` lets go of what it holds (the leader lock; the
   worker's heartbeat and leases), then `exit` ends the process with EXIT_GAVE_UP. The orchestrator starts it
   again; failover moves its work meanwhile.
4. Liveness is progress: `stalled()` names the critical loops that completed no step within `stall_after` (a loop
   whose step is long calls `beat(name)` along the way); /healthz fails while one is stalled or the process gave up.
Time comes from the injected clock; the watchdog checks bounds every WATCH_SECONDS.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from shardherd.shared.clock import Clock, SystemClock

log = logging.getLogger(__name__)

BASE_BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 30.0
WATCH_SECONDS = 0.1
EXIT_GAVE_UP = 70  # EX_SOFTWARE: a critical loop failed or stalled; the orchestrator restarts the process
STALL_INTERVALS = 3  # default bound of a critical loop: this many intervals without a completed step
GIVE_UP_FLOOR_SECONDS = 30.0  # a critical loop stalled this long at least (and past its bound) ends the process


class Kind(enum.Enum):
    """What a failure of the thread means for the process."""

    RESTARTABLE = "restartable"
    CRITICAL = "critical"


@dataclass(frozen=True, slots=True)
class LoopState:
    """One supervised thread as health and /metrics show it."""

    name: str
    kind: Kind
    restarts: int
    seconds_since_progress: float
    stall_after: float | None  # critical loops only
    last_error: str | None

    @property
    def stalled(self) -> bool:
        """True for a critical loop without a completed step within its bound."""
        return self.stall_after is not None and self.seconds_since_progress > self.stall_after


@dataclass(slots=True)
class _Entry:
    kind: Kind
    stall_after: float | None
    last_progress: float
    restarts: int = 0
    last_error: str | None = None
    done: bool = False  # a loop that ended normally (stop requested) or a body that returned


class Supervisor:
    """Runs and watches one process's long-lived threads; see the module invariants."""

    def __init__(self, clock: Clock | None = None, give_up: Callable[[str], None] | None = None,
                 exit: Callable[[int], None] | None = None, give_up_floor: float = GIVE_UP_FLOOR_SECONDS) -> None:
        self._clock = clock or SystemClock()
        self._floor = give_up_floor
        self._give_up = give_up
        self._exit = exit or os._exit  # tests record the status instead
        self._entries: dict[str, _Entry] = {}
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._gave_up: str | None = None
        self._watchdog: threading.Thread | None = None

    # ------------------------------------------------------------------ starting threads
    def loop(self, name: str, step: Callable[[], object], interval: float, kind: Kind,
             stall_after: float | None = None, stop: threading.Event | None = None) -> threading.Thread:
        """Start a daemon thread that runs `step` every `interval` s (fixed delay) until `stop` is set.

        A critical loop's bound is `stall_after`, by default STALL_INTERVALS intervals.
        """
        bound = (stall_after if stall_after is not None else STALL_INTERVALS * interval) \
            if kind is Kind.CRITICAL else None
        self._register(name, kind, bound)
        halt = stop or self._stop

        def run() -> None:
            backoff = max(BASE_BACKOFF_SECONDS, interval)
            while not halt.is_set() and not self._stop.is_set():
                if self._attempt(name, step):
                    backoff = max(BASE_BACKOFF_SECONDS, interval)
                    halt.wait(interval)
                    continue
                if kind is Kind.CRITICAL:
                    return
                halt.wait(backoff)
                backoff = min(MAX_BACKOFF_SECONDS, backoff * 2)
            self._finish(name)

        return self._start(name, run)

    def thread(self, name: str, body: Callable[[], object], kind: Kind = Kind.RESTARTABLE) -> threading.Thread:
        """Start a daemon thread that runs `body` once; a restartable body that raises runs again after a backoff."""
        self._register(name, kind, None)

        def run() -> None:
            backoff = BASE_BACKOFF_SECONDS
            while not self._stop.is_set():
                if self._attempt(name, body):
                    break
                if kind is Kind.CRITICAL:
                    return
                self._stop.wait(backoff)
                backoff = min(MAX_BACKOFF_SECONDS, backoff * 2)
            self._finish(name)

        return self._start(name, run)

    def watch(self) -> None:
        """Start the watchdog: a critical loop past its bound makes the process give up (invariant 3)."""
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="supervisor", daemon=True)
            self._watchdog.start()

    def stop(self) -> None:
        """Stop every loop started without its own stop event, and the watchdog (a graceful shutdown)."""
        self._stop.set()

    # ------------------------------------------------------------------ reporting
    def beat(self, name: str) -> None:
        """A long step made progress (its loop is not stalled)."""
        now = self._clock.monotonic()
        with self._guard:
            entry = self._entries.get(name)
            if entry is not None:
                entry.last_progress = now

    def snapshot(self) -> list[LoopState]:
        """Every supervised thread, by name."""
        now = self._clock.monotonic()
        with self._guard:
            return [LoopState(name, entry.kind, entry.restarts, now - entry.last_progress,
                              None if entry.done else entry.stall_after, entry.last_error)
                    for name, entry in sorted(self._entries.items())]

    def stalled(self) -> list[LoopState]:
        """The critical loops without a completed step within their bound."""
        return [state for state in self.snapshot() if state.stalled]

    @property
    def gave_up(self) -> str | None:
        """Why the process gave up (None while it has not)."""
        return self._gave_up

    def problem(self) -> str | None:
        """Why liveness fails now (gave up, or a stalled critical loop); None while every critical loop progresses."""
        if self._gave_up is not None:
            return f"gave up: {self._gave_up}"
        stalled = self.stalled()
        if not stalled:
            return None
        return "; ".join(f"{state.name} made no progress for {state.seconds_since_progress:.1f} s "
                         f"(bound {state.stall_after:.1f} s)" for state in stalled)

    # ------------------------------------------------------------------ internals
    def _register(self, name: str, kind: Kind, stall_after: float | None) -> None:
        with self._guard:
            self._entries[name] = _Entry(kind, stall_after, self._clock.monotonic())

    def _start(self, name: str, run: Callable[[], None]) -> threading.Thread:
        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread

    def _attempt(self, name: str, step: Callable[[], object]) -> bool:
        """Run one step; True if it completed. A failure is logged in one line (traceback at debug), and counted."""
        try:
            step()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            with self._guard:
                entry = self._entries[name]
                entry.restarts += 1
                entry.last_error = error
                kind, restarts = entry.kind, entry.restarts
            if kind is Kind.CRITICAL:
                log.error("%s failed: %s", name, error, exc_info=True)
                self._abandon(f"{name} failed: {error}")
            else:
                log.error("%s failed (restart %d): %s", name, restarts, error)
                log.debug("%s failure", name, exc_info=True)
            return False
        self.beat(name)
        return True

    def _finish(self, name: str) -> None:
        with self._guard:
            self._entries[name].done = True

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_SECONDS):
            stalled = [state for state in self.stalled()
                       if state.seconds_since_progress > max(self._floor, state.stall_after or 0.0)]
            if stalled:
                state = stalled[0]
                self._abandon(f"{state.name} made no progress for {state.seconds_since_progress:.1f} s "
                              f"(bound {state.stall_after:.1f} s)")
                return

    def _abandon(self, why: str) -> None:
        """Give up what the process holds and exit (once, whichever thread comes first)."""
        with self._guard:
            if self._gave_up is not None:
                return
            self._gave_up = why
        log.critical("giving up and exiting with status %d: %s", EXIT_GAVE_UP, why)
        try:
            if self._give_up is not None:
                self._give_up(why)
        except Exception:  # the exit below must happen whatever letting go did
            log.exception("letting go before the exit failed")
        finally:
            self._exit(EXIT_GAVE_UP)
