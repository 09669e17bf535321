"""A contender that asks the holder's API for its lock version (decision 0012), on every backend and a virtual clock.

The probe here is the holder's own `holder_report` (what `GET /v1/lock` answers), or None for a killed holder; the
HTTP path itself is tested in tests/services/test_peer_api.py.
"""

from __future__ import annotations

from collections.abc import Callable

from shardherd.coordinator.leader_lock import STORE_CHECK_SECONDS, HolderReport, LeaderLock
from shardherd.shared.clock import ManualClock
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_meter import StoreMeter, usage_total

DURATION_MS = 6_000
PERIOD_MS = 1_500
STEP = PERIOD_MS / 3000  # the lock keeper ticks three times per heartbeat period


class Holders:
    """The replicas' APIs by URL; a killed replica's URL does not answer; an answer takes `latency` seconds."""

    def __init__(self, clock: ManualClock, latency: float = 0.0) -> None:
        self.clock = clock
        self.latency = latency
        self.locks: dict[str, LeaderLock] = {}
        self.dead: set[str] = set()

    def probe(self, url: str) -> HolderReport | None:
        """What `GET /v1/lock` at `url` answers."""
        lock = self.locks.get(url)
        if lock is None or url in self.dead:
            return None
        report = lock.holder_report()
        self.clock.advance(self.latency)
        return report

    def lock(self, store: LeaseStore, name: str, clock: ManualClock, probe: bool = True) -> LeaderLock:
        """A replica's lock whose API answers at http://<name>/."""
        lock = LeaderLock(store, name, clock, DURATION_MS, PERIOD_MS, holder_probe=self.probe if probe else None)
        lock.set_api_url(f"http://{name}/")
        self.locks[f"http://{name}/"] = lock
        return lock


def _for(clock: ManualClock, seconds: float, *locks: LeaderLock) -> None:
    """Tick `locks` every STEP for `seconds`."""
    until = clock.monotonic() + seconds
    _until(clock, lambda: clock.monotonic() >= until, seconds + 1, *locks)


def _until(clock: ManualClock, done: Callable[[], bool], limit: float, *locks: LeaderLock) -> float:
    """Tick `locks` every STEP until `done()`; the virtual seconds it took (AssertionError past `limit`)."""
    started = clock.monotonic()
    while not done():
        assert clock.monotonic() - started < limit, "not done in time"
        clock.advance(STEP)
        for lock in locks:
            lock.tick()
    return clock.monotonic() - started


def _lock_reads(meter: StoreMeter) -> int:
    return usage_total(meter.rows(), operation="get Leader").requests


def _holder_and_contender(store: LeaseStore, seconds: float, latency: float = 0.0,
                          probe: bool = True) -> tuple[ManualClock, Holders, LeaderLock, LeaderLock]:
    """coord-a holding the lock and coord-b contending, both ticked for `seconds` of virtual time."""
    clock = ManualClock()
    holders = Holders(clock, latency)
    holder = holders.lock(store, "coord-a", clock)
    contender = holders.lock(store, "coord-b", clock, probe=probe)
    assert holder.tick()
    _for(clock, seconds, holder, contender)
    return clock, holders, holder, contender


def test_a_contender_that_hears_from_the_holder_reads_the_item_once_per_store_check(store: LeaseStore) -> None:
    """Issue 17: the standby's lock polls (one read every heartbeat period) were 18 of the stack's 70 units."""
    clock = ManualClock()
    holders = Holders(clock)
    holder = holders.lock(store, "coord-a", clock)
    meter = StoreMeter(store)
    contender, reading = holders.lock(meter, "coord-b", clock), holders.lock(store, "coord-c", clock, probe=False)
    assert holder.tick()
    window = 3 * STORE_CHECK_SECONDS
    alarms = 0
    for _ in range(int(window / STEP)):
        _for(clock, STEP, holder, contender, reading)
        alarms += contender.looks_abandoned()
    assert alarms == 0  # a live holder never makes the contender watch worker rows (decision 0010's scans)
    assert holder.is_leader() and not contender.is_leader() and not reading.is_leader()
    assert _lock_reads(meter) <= window / STORE_CHECK_SECONDS + 1  # was one per heartbeat period: 60
    assert contender.holder_url() == "http://coord-a/" and contender.holder_id() == "coord-a"
    assert store.get_state("Leader")["ownerApiUrl"] == "http://coord-a/"  # type: ignore[index]


def test_a_killed_holder_is_taken_over_after_the_lease_duration_with_its_sightings(store: LeaseStore) -> None:
    clock = ManualClock()
    holders = Holders(clock)
    holder = holders.lock(store, "coord-a", clock)
    holder.publish_with_heartbeat(lambda room: b"sightings")
    contender = holders.lock(store, "coord-b", clock)
    assert holder.tick()
    _for(clock, 10, holder, contender)
    killed_at = clock.monotonic()
    holders.dead.add("http://coord-a/")  # kill -9: no more heartbeats, and its API is gone with it
    assert _until(clock, contender.looks_abandoned, 5, contender) <= PERIOD_MS / 1000 + STEP  # starts watching
    waited = clock.monotonic() - killed_at
    waited += _until(clock, contender.is_leader, 20, contender)
    assert DURATION_MS / 1000 < waited <= (DURATION_MS + 2 * PERIOD_MS) / 1000 + STEP
    assert contender.epoch() == 2
    handover = contender.take_handover()
    assert handover is not None and handover.observed_rows == b"sightings"  # read with the version it took over


def test_a_holder_whose_heartbeats_stop_but_whose_api_answers_is_taken_over_all_the_same(store: LeaseStore) -> None:
    """The holder still answers with its last version (store partitioned from it): a lease duration after the
    contender first heard that version, it reads the item and takes over, never before the holder's lease ends."""
    clock, _, holder, contender = _holder_and_contender(store, 10)
    stopped = clock.monotonic()
    _until(clock, contender.is_leader, 20, contender)  # the holder no longer ticks, but answers probes
    assert clock.monotonic() - stopped > DURATION_MS / 1000
    assert not holder.is_leader()  # its lease had run out on its own clock first


def test_a_release_is_taken_at_the_next_period_and_a_stranger_at_the_url_is_not_believed(store: LeaseStore) -> None:
    clock, holders, holder, contender = _holder_and_contender(store, 5)
    assert holder.release()
    assert _until(clock, contender.is_leader, 10, contender) <= PERIOD_MS / 1000 + STEP

    meter = StoreMeter(store)
    third = holders.lock(meter, "coord-c", clock)
    holders.locks["http://coord-b/"] = holders.lock(store, "impostor", clock)  # answers for coord-b's URL
    meter.reset()
    _for(clock, 15, contender, third)
    assert contender.is_leader() and not third.is_leader()
    assert _lock_reads(meter) >= 15 / (PERIOD_MS / 1000) - 1  # it read the item every period instead


def _takeover_after_kill(store: LeaseStore, probe: bool, latency: float) -> float:
    """Seconds from a holder's kill -9 to a contender's takeover (probing with `latency` per answer, or reading)."""
    clock, holders, _, contender = _holder_and_contender(store, 10, latency, probe)
    holders.dead.add("http://coord-a/")
    return _until(clock, contender.is_leader, 20, contender)


def test_a_slow_answer_does_not_make_the_takeover_later_than_reading_the_item(store: LeaseStore) -> None:
    """The takeover clock starts when the answer arrives less half the margin: a 0.1 s answer (a loaded machine)
    must not push the takeover a heartbeat period past where a contender reading the item takes over."""
    reading = _takeover_after_kill(store, probe=False, latency=0.0)
    store.delete_state("Leader")
    probing = _takeover_after_kill(store, probe=True, latency=0.1)
    assert probing <= reading + 0.1 + 1e-9
