"""The leader lock: a re-implementation of the Java DynamoDB lock client 1.4.0's item protocol over the store.

Item `Leader` in the coordinator-state table: `ownerName`, `leaseDuration` (milliseconds, as a string),
`recordVersionNumber` (a fresh UUID on every acquire and heartbeat), `isReleased` ("1" when released). A KCL 3.x
coordinator state table can be shared. shardherd adds `leaderEpoch` (N, +1 per term, for operators),
`leaderTerm` (S, a UUID per term) that fences every assignment write, `lastSuccessAt` (N, wall-clock
milliseconds of the leader's newest successful run, sent with each heartbeat at no extra write) and `observedRows`
(B, the leader's worker-row sightings, see coordinator/liveness.py, also sent with each heartbeat, sized so the whole
item stays within `LOCK_ITEM_BYTES`: one write unit per heartbeat) from which a successor that takes the lock over
starts, and `ownerApiUrl` (S, where the holder's operator API answers). The Java client
deletes the item on release, so the epoch cannot live only there: every new term first takes the next number from a
counter item, `LeaderEpoch` (`epoch`, N), with a conditional write, so an epoch never repeats for a table, across
releases, restarts and KCL holders in between. A contender takes
over a lock whose `recordVersionNumber` it has watched unchanged for `leaseDuration` on its own monotonic clock, so
clocks of different hosts are never compared. A write whose reply was lost (the store's retry then fails on its own
write) or went unanswered counts once a read shows its version under this owner's name (`LeaderLock._ours`).
Unlike KCL's 120 s / 30 s defaults, shardherd uses seconds (see docs/kcl-differences.md).

A contender with a `holder_probe` asks the holder's API for the version it holds instead of reading the item every
heartbeat period (docs/decisions/0012-standby-reads.md): a version the holder reports counts as seen when its answer
arrives less half the lease margin (never before the probe was sent): the holder sent that heartbeat before it
answered, so the takeover still comes after the holder's lease has ended. Only reads of the item itself ever lead to
a takeover (a conditional put on the version read), and the contender reads it every period again as soon as the
holder does not answer, says it does not lead, or has reported the same version for a lease duration; otherwise
once per `STORE_CHECK_SECONDS`.
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from shardherd.shared.clock import Clock
from shardherd.shared.errors import ShardherdError, StoreUnavailable
from shardherd.shared.store import STATE_KEY_ATTRIBUTE, Fence, LeaseStore, StateValue
from shardherd.shared.store_meter import acting_as, state_size

LOCK_KEY = "Leader"
OWNER = "ownerName"
DURATION = "leaseDuration"
VERSION = "recordVersionNumber"
RELEASED = "isReleased"
EPOCH = "leaderEpoch"
TERM = "leaderTerm"
LAST_SUCCESS = "lastSuccessAt"
OBSERVED = "observedRows"
API_URL = "ownerApiUrl"
EPOCH_COUNTER_SUFFIX = "Epoch"  # the counter item of lock item `Leader` is `LeaderEpoch`
EPOCH_COUNTER = "epoch"
_EPOCH_ATTEMPTS = 5
LOCK_ITEM_BYTES = 1024  # one DynamoDB write unit: what a heartbeat may cost, sightings included
_MILLIS_PLACEHOLDER = 1_700_000_000_000  # a wall-clock milliseconds value, to size `lastSuccessAt` before it is known
STORE_CHECK_SECONDS = 30.0  # a contender whose probes of the holder answer still reads the item this often

log = logging.getLogger(__name__)

GIVEN_UP = "released"


@dataclass(frozen=True, slots=True)
class LockView:
    """What a reader knows about the lock item (for operators and contenders)."""

    owner: str | None
    epoch: int | None
    version: str | None
    lease_duration_millis: int | None
    released: bool
    last_success_at: float | None = None  # wall-clock seconds of the leader's newest successful run, if it said
    api_url: str | None = None  # where the holder's operator API answers, if it said


@dataclass(frozen=True, slots=True)
class HolderReport:
    """What a lock holder's API says about its own hold (answered from its memory, no store read)."""

    replica_id: str
    leading: bool
    version: str | None


HolderProbe = Callable[[str], HolderReport | None]  # the holder's API URL -> its answer, None if it did not answer


@dataclass(slots=True)
class _Held:
    term: str
    epoch: int
    version: str
    valid_until: float  # monotonic seconds: send time of the last successful write + lease duration - margin
    # Versions of heartbeats sent since the last one known to land, by send time: one whose reply was lost may
    # have landed (`LeaderLock._ours`).
    unanswered: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class _Observed:
    version: str
    first_seen: float
    duration: float
    read_at: float  # monotonic seconds when the first read of this version returned (it was written before then)
    observed_rows: StateValue | None
    repeated: bool = False  # a later poll found the same version: the holder missed at least one heartbeat
    from_probe: bool = False  # first seen in the holder's answer: `observed_rows` comes with the first item read


@dataclass(frozen=True, slots=True)
class Handover:
    """What the previous holder published with its last heartbeat (`observedRows`), written before `published_before`.

    `published_before` is on this process's monotonic clock: when this contender first read that lock version.
    """

    observed_rows: StateValue
    published_before: float


class LeaderLock:
    """One process's handle on the leader lock; `tick()` does whatever is due (acquire attempt or heartbeat).

    Not thread-safe by itself except `is_leader`/`fence`/`epoch`, which read a snapshot under a lock; run `tick()`
    from one thread (see `LockKeeper`).
    """

    def __init__(self, store: LeaseStore, owner: str, clock: Clock, lease_duration_millis: int,
                 heartbeat_period_millis: int, key: str = LOCK_KEY,
                 on_change: Callable[[bool, int | None], None] | None = None,
                 last_success: Callable[[], float | None] | None = None,
                 holder_probe: HolderProbe | None = None) -> None:
        if heartbeat_period_millis * 2 > lease_duration_millis:
            raise ValueError("the heartbeat period must be at most half of the lease duration")
        self._store = store
        self._owner = owner
        self._clock = clock
        self._duration = lease_duration_millis / 1000.0
        self._period = heartbeat_period_millis / 1000.0
        self._margin = max(0.05, self._duration * 0.05)
        self._key = key
        self._on_change = on_change
        self._last_success = last_success  # rides along with each heartbeat: freshness without a status write
        self._held: _Held | None = None
        self._observed: _Observed | None = None
        self._next_due = 0.0
        self._stand_down_until = -math.inf
        self._guard = threading.Lock()
        self._observations: Callable[[int], bytes | None] | None = None
        self._handover: Handover | None = None
        self._probe = holder_probe
        self._sending: str | None = None  # the version of the heartbeat being sent now (holder_report answers it)
        self._api_url: str | None = None
        self._holder: tuple[str, str] | None = None  # (owner, API URL) of the holder, from the last item read
        self._store_read_at = -math.inf  # monotonic time of this contender's last read of the item
        self._store_ok_at = -math.inf  # monotonic time the store last answered this lock (heartbeat, read)
        self._store_failed_at = -math.inf  # ... and last failed to

    # ------------------------------------------------------------------ queries (any thread)
    def is_leader(self) -> bool:
        """True while this process holds the lock and its lease has not run out on the local monotonic clock."""
        with self._guard:
            return self._held is not None and self._clock.monotonic() < self._held.valid_until

    def fence(self) -> Fence | None:
        """The condition that makes a lease write fail unless this exact term still holds the lock."""
        with self._guard:
            if self._held is None or self._clock.monotonic() >= self._held.valid_until:
                return None
            return Fence(self._key, {OWNER: self._owner, TERM: self._held.term})

    def epoch(self) -> int | None:
        """The epoch of the term held now, or None."""
        with self._guard:
            return self._held.epoch if self._held else None

    def read(self, consistent: bool = True) -> LockView:
        """The lock item as stored (one read; eventually consistent views cost half on DynamoDB)."""
        return _view(self._store.get_state(self._key, consistent))

    def set_api_url(self, url: str) -> None:
        """Where this replica's API answers: written into the item at each acquire (`ownerApiUrl`) for contenders."""
        self._api_url = url

    def own_view(self) -> LockView | None:
        """The item as this holder last wrote it (no store read), or None when this process does not lead."""
        with self._guard:
            held = self._held
            if held is None or self._clock.monotonic() >= held.valid_until:
                return None
            version, epoch = held.version, held.epoch
        last_success = self._last_success() if self._last_success is not None else None
        return LockView(self._owner, epoch, version, int(self._duration * 1000), False, last_success, self._api_url)

    def holder_report(self) -> HolderReport:
        """The answer to a contender's probe: whether this process leads and the version of its newest heartbeat.

        A heartbeat still on its way counts: its version was sent before this answer (all a contender's clock needs),
        and a contender that hears a version the store never gets only starts its clock again later.
        """
        with self._guard:
            held = self._held
            leading = held is not None and self._clock.monotonic() < held.valid_until
            version = (self._sending or held.version) if held is not None and leading else None
            return HolderReport(self._owner, leading, version)

    def check_store(self, within: float) -> None:
        """Raise StoreUnavailable unless the store answers (a readiness check that mostly costs no read).

        Evidence: this lock's own calls within `within` seconds (heartbeats on the holder, item reads on a
        contender, counted with the takeover write that follows a read): whether the last of them failed or
        answered; without any, one eventually consistent read of the item. That read never overrules a failure
        within `within`: a store that answers reads and refuses writes (a read-only SQLite file, a policy without
        write rights) cannot be led from, and a replica whose takeovers fail there is not ready.
        """
        now = self._clock.monotonic()
        with self._guard:
            answered, failed = self._store_ok_at, self._store_failed_at
        if failed >= answered and now - failed <= within:
            raise StoreUnavailable(f"the leader lock's last store call failed {now - failed:.1f} s ago")
        if now - answered <= within:
            return
        self._store.get_state(self._key, consistent=False)
        self._note_store(True)

    def _note_store(self, answered: bool) -> None:
        now = self._clock.monotonic()
        with self._guard:
            if answered:
                self._store_ok_at = now
            else:
                self._store_failed_at = now

    def holder_id(self) -> str | None:
        """The holder's owner name as of this process's last read of the item (its own when it leads)."""
        if self.is_leader():
            return self._owner
        holder = self._holder
        return holder[0] if holder is not None else None

    def holder_url(self) -> str | None:
        """The API URL of the holder as of this process's last read of the item (its own when it leads)."""
        if self.is_leader():
            return self._api_url
        holder = self._holder
        return holder[1] if holder is not None else None

    def publish_with_heartbeat(self, observations: Callable[[int], bytes | None]) -> None:
        """Send `observations(room)` as `observedRows` with every heartbeat (the leader's liveness sightings).

        `room` is how many bytes the value may take so that the lock item stays within `LOCK_ITEM_BYTES`.
        """
        self._observations = observations

    def looks_abandoned(self) -> bool:
        """True while this process does not hold the lock and its holder has missed a heartbeat (a takeover may come).

        A contender then starts watching worker rows itself, so that as a new leader it need not start from zero.
        """
        seen = self._observed
        return self._held is None and seen is not None and seen.repeated

    def take_handover(self) -> Handover | None:
        """What the holder this process took the lock over from published, once (None after a plain acquire)."""
        with self._guard:
            handover, self._handover = self._handover, None
        return handover

    # ------------------------------------------------------------------ protocol (one thread)
    def tick(self) -> bool:
        """Heartbeat if holding and due, else try to acquire if due; returns `is_leader()` afterwards.

        Store outages are survived: the holder keeps its term until its lease runs out locally.
        """
        with acting_as("lock"):
            return self._tick()

    def _tick(self) -> bool:
        now = self._clock.monotonic()
        if now >= self._next_due:
            self._next_due = now + self._period
            try:
                if self._held is not None:
                    self._heartbeat()
                elif now >= self._stand_down_until:
                    self._try_acquire()
            except StoreUnavailable as exc:
                self._note_store(False)
                log.warning("leader lock: store unavailable: %s", exc)
        if self._held is not None and not self.is_leader():
            self._drop("lease ran out without a successful heartbeat")
        return self.is_leader()

    def release(self, stand_down_seconds: float = 0.0) -> bool:
        """Give the lock up at once (SIGTERM, repeated failed runs) so a successor need not wait for expiry.

        With `stand_down_seconds`, this replica makes no acquire attempt for that long, so another replica takes
        the lock instead of this one taking it straight back (a release after failed runs).
        """
        held = self._held
        if held is None:
            return False
        if stand_down_seconds > 0:
            self._stand_down_until = self._clock.monotonic() + stand_down_seconds
            log.warning("leader lock: %s stays out of the election for %.1f s", self._owner, stand_down_seconds)
        self._drop(GIVEN_UP)
        try:
            return self._store.delete_state(self._key, {OWNER: self._owner, VERSION: held.version})
        except ShardherdError as exc:  # unavailable, or a permanent error (denied, disk full): it expires instead
            log.warning("leader lock: release failed, the lock will expire instead: %s", exc)
            return False

    def _probed(self, sent: float) -> bool:
        """Ask the holder's API for its version; True if its answer stands in for reading the item this period.

        A version first heard of counts as seen when the answer arrived (the holder wrote it before answering). The
        item is read instead when there is no holder to ask, it does not answer or does not lead, a store check is
        due, or the holder has reported one version for a lease duration (a takeover may be due).
        """
        holder, seen = self._holder, self._observed
        if self._probe is None or holder is None or sent - self._store_read_at >= STORE_CHECK_SECONDS:
            return False
        report = self._probe(holder[1])
        if report is None or not report.leading or report.version is None or report.replica_id != holder[0]:
            if seen is not None:
                seen.repeated = True  # the holder does not answer as the leader: a takeover may come
            return False
        heard_at = self._clock.monotonic()
        if seen is None or seen.version != report.version:
            # The holder sent that heartbeat before it answered, so before `heard_at`: starting the clock half the
            # holder's margin earlier (never before the probe was sent) still ends it after the holder's lease, and
            # keeps a slow answer from making the takeover a period later than a read of the item would.
            first_seen = max(sent, heard_at - self._margin / 2)
            self._observed = _Observed(report.version, first_seen, seen.duration if seen else self._duration,
                                       heard_at, None, from_probe=True)
            return True
        if sent - seen.first_seen > 2 * self._period:
            seen.repeated = True  # the holder answers, but its heartbeats do not land
        return sent - seen.first_seen <= seen.duration

    def _try_acquire(self) -> None:
        sent = self._clock.monotonic()
        if self._probed(sent):
            return
        # An eventually consistent read is enough (and half the price on DynamoDB): every takeover is a put
        # conditioned on exactly what was read, so a stale read can only make an attempt fail, never succeed wrongly.
        item = self._store.get_state(self._key, consistent=False)
        read_at = self._clock.monotonic()
        self._store_read_at = sent
        owner, url = (_text(item.get(OWNER)), _text(item.get(API_URL))) if item is not None else (None, None)
        self._holder = (owner, url) if owner is not None and url is not None and url != self._api_url else None
        self._take_if_due(item, sent, read_at)
        self._note_store(True)  # after any takeover write: a read alone must not hide a write that fails

    def _take_if_due(self, item: dict[str, StateValue] | None, sent: float, read_at: float) -> None:
        """Write a new term over `item` (the lock item read at `sent`) if it is free, released or abandoned."""
        if item is None:
            self._write_new(sent, None, {"key": None})
            return
        version = _text(item.get(VERSION))
        epoch = _int(item.get(EPOCH))
        if _text(item.get(RELEASED)) == "1" and version is not None:
            self._write_new(sent, epoch, {VERSION: version, RELEASED: "1"})
            return
        if version is None:
            # Not an item the Java lock client could have written: take it unless someone versions it meanwhile.
            self._write_new(sent, epoch, {VERSION: None})
            return
        seen = self._held_long_enough(item, version, sent, read_at)
        if seen is not None:
            log.info("leader lock: %s held by %s unchanged for %.1f s: taking over", version,
                     item.get(OWNER), sent - seen.first_seen)
            handover = None if seen.observed_rows is None else Handover(seen.observed_rows, seen.read_at)
            self._write_new(sent, epoch, {VERSION: version}, handover)

    def _held_long_enough(self, item: Mapping[str, StateValue], version: str, sent: float,
                          read_at: float) -> _Observed | None:
        """Note this read of another holder's `version`; its observation once unchanged for its duration, else None.

        The lock may be taken over once the observation is returned.
        """
        seen = self._observed
        duration = _int(item.get(DURATION))
        if seen is None or seen.version != version:
            self._observed = _Observed(version, sent, duration / 1000.0 if duration else self._duration, read_at,
                                       item.get(OBSERVED))
            return None
        if seen.from_probe:  # the sightings of this version and its duration come with its first read
            # `read_at` stays when the holder first answered with this version: it computed the version's sightings
            # before it answered, so they are at least that old (a later read would throw away the time between).
            seen.from_probe, seen.observed_rows = False, item.get(OBSERVED)
            seen.duration = duration / 1000.0 if duration else self._duration
            # Heard from the holder within two periods (a routine store check): no heartbeat is known to be missed.
            seen.repeated = seen.repeated or sent - seen.first_seen > 2 * self._period
        else:
            seen.repeated = True
        return seen if sent - seen.first_seen > seen.duration else None

    def _next_epoch(self, previous_epoch: int | None) -> int:
        """Take the next epoch from the counter item (never below the lock item's own): each number is used once.

        Taken after the lock item was read and before it is written, so the epochs of successive holders increase;
        a number taken by an attempt that then loses the lock is simply skipped.
        """
        for _ in range(_EPOCH_ATTEMPTS):
            item = self._store.get_state(self._key + EPOCH_COUNTER_SUFFIX)
            current = _int(item.get(EPOCH_COUNTER)) if item is not None else None
            epoch = max(current or 0, previous_epoch or 0) + 1
            condition: dict[str, StateValue | None] = (
                {STATE_KEY_ATTRIBUTE: None} if item is None else {EPOCH_COUNTER: current})
            if self._store.put_state(self._key + EPOCH_COUNTER_SUFFIX, {EPOCH_COUNTER: epoch}, condition):
                return epoch
        raise StoreUnavailable(f"the leader epoch counter kept changing under {_EPOCH_ATTEMPTS} attempts")

    def _write_new(self, sent: float, previous_epoch: int | None, condition: dict[str, StateValue | None],
                   handover: Handover | None = None) -> None:
        term = str(uuid.uuid4())
        version = str(uuid.uuid4())
        epoch = self._next_epoch(previous_epoch)
        item: dict[str, StateValue] = {
            OWNER: self._owner, DURATION: str(int(self._duration * 1000)), VERSION: version,
            EPOCH: epoch, TERM: term, **({API_URL: self._api_url} if self._api_url is not None else {}),
        }
        if self._store.put_state(self._key, item, condition) or self._ours({version: sent}) is not None:
            with self._guard:
                self._held = _Held(term, epoch, version, sent + self._duration - self._margin)
                self._handover = handover
            self._observed = None
            log.info("leader lock: %s became leader, epoch %d", self._owner, epoch)
            if self._on_change:
                self._on_change(True, epoch)
        else:
            self._observed = None

    def _heartbeat(self) -> None:
        held = self._held
        assert held is not None
        sent = self._clock.monotonic()
        version = str(uuid.uuid4())
        attributes: dict[str, StateValue] = {VERSION: version, DURATION: str(int(self._duration * 1000))}
        last_success = self._last_success() if self._last_success is not None else None
        if last_success is not None:
            attributes[LAST_SUCCESS] = int(last_success * 1000)
        observed = self._observations(self._room(held)) if self._observations is not None else None
        # Sightings are relative to this heartbeat's time: an older value must never stay under a newer version.
        remove = [OBSERVED] if observed is None else []
        if observed is not None:
            attributes[OBSERVED] = observed
        with self._guard:
            self._sending = version
        held.unanswered[version] = sent
        try:
            ok = self._store.update_state(self._key, attributes, remove=remove,
                                          condition={OWNER: self._owner, VERSION: held.version})
            landed = version if ok else self._ours(held.unanswered)
        finally:
            with self._guard:
                self._sending = None
        self._note_store(True)  # applied or not, the store answered
        if landed is None:
            self._drop("the lock item changed under us")
            return
        with self._guard:
            held.version = landed
            held.valid_until = held.unanswered[landed] + self._duration - self._margin
        held.unanswered.clear()

    def _ours(self, sent: Mapping[str, float]) -> str | None:
        """Which of the versions this process `sent` (and heard nothing of) the lock item holds under its name.

        A write whose reply was lost is retried by the store, and the retry's condition fails on the very write it
        repeats; a heartbeat whose every attempt went unanswered may have landed too. Versions are fresh UUIDs, so
        a match is this process's own write (one consistent read, made only after a write did not land as sent).
        """
        item = self._store.get_state(self._key)
        version = _text(item.get(VERSION)) if item is not None and _text(item.get(OWNER)) == self._owner else None
        return version if version in sent else None

    def _room(self, held: _Held) -> int:
        """Bytes left for `observedRows` in a lock item of at most `LOCK_ITEM_BYTES` (every other attribute sized)."""
        others = state_size(self._key, {OWNER: self._owner, DURATION: str(int(self._duration * 1000)),
                                        VERSION: held.version, EPOCH: held.epoch, TERM: held.term,
                                        LAST_SUCCESS: _MILLIS_PLACEHOLDER, OBSERVED: b"",
                                        **({API_URL: self._api_url} if self._api_url is not None else {})})
        return max(0, LOCK_ITEM_BYTES - others)

    def _drop(self, why: str) -> None:
        with self._guard:
            held, self._held = self._held, None
        if held is not None:
            level = logging.INFO if why == GIVEN_UP else logging.WARNING  # giving it up on stop is no trouble
            log.log(level, "leader lock: %s lost leadership (epoch %d): %s", self._owner, held.epoch, why)
            if self._on_change:
                self._on_change(False, held.epoch)


def _text(value: StateValue | None) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: StateValue | None) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _view(item: dict[str, StateValue] | None) -> LockView:
    if item is None:
        return LockView(None, None, None, None, False)
    last_success = _int(item.get(LAST_SUCCESS))
    return LockView(_text(item.get(OWNER)), _int(item.get(EPOCH)), _text(item.get(VERSION)),
                    _int(item.get(DURATION)), _text(item.get(RELEASED)) == "1",
                    None if last_success is None else last_success / 1000, _text(item.get(API_URL)))
