"""The leader's liveness observations: who is alive and which leases expired, judged on the leader's own clock.

Nothing here compares clocks of different machines. The leader remembers, per lease (mode `lease`) or per worker (mode
`worker`), the last value of a counter it saw and when (its monotonic time) that value last changed. Something whose
value has not changed for the failover time is expired. A newly seen owned lease or worker counts as freshly renewed,
so after a leader change nothing expires until the new leader has watched it for a failover period (as in KCL). A
worker row a term's first scan found is alive only once seen changing (it may be a dead worker's last row); a row that
first appears at a later scan of the term was written since, so it is alive at once (a joining worker is filled by the
run that first sees it, not one heartbeat later: decision 0038).

`WorkerGrace` is the one rule for how long a worker's row may stay unchanged, used by the leader and by the operator
API: a shardherd agent (its row carries the `hb` counter) rewrites its row every heartbeat interval in both liveness
modes, so it is gone after one failover time; a Java KCL worker (no `hb`) rewrites its row only every reporter
interval, so it is gone after KCL's own expiry, two reporter intervals.

Agents also name the row they last wrote in each request on the coordinator channel (coordinator/assignment_feed.py,
`beats`): a row still the one named counts as unchanged since that request first named it (it was written before),
so a leader that scans rarely still knows when rows changed, for its own verdicts and for what it publishes. A named
row is also evidence of life, as a change is: only a running agent makes requests, so a row its agent named is alive
even at a term's first scan (its silence still counts from the first naming, so a dead agent's row expires on time).

A new leader need not start from zero: the old leader publishes, with each lock heartbeat, how long it has seen each
worker row unchanged (`encode_sightings`: 8 bytes a worker, within the lock item's one write unit). The successor
takes over only after watching that lock item unchanged for the lock's lease duration, so the publication is at least
that old on its own clock; a row that is still the one sighted (same id digest, same `hb` and `lut` modulo 2^16) has
therefore been silent for at least the published silence plus that time. A row that changed since is judged afresh,
so a stale publication cannot make a live worker look dead (its `hb` would have to move by 65,536 heartbeats, or its
`lut` by 18 hours, to look unchanged).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from shardherd.shared.config import Settings
from shardherd.shared.lease import Lease
from shardherd.shared.store import StateValue
from shardherd.shared.worker import WorkerRecord

# KCL's discovery period is leaseAssignmentIntervalMillis / 2 - 25 ms, and its assignment interval defaults to twice
# the failover time: a KCL worker finds a lease assigned to it up to about one failover time later.
_KCL_DISCOVERY_FAILOVERS = 1.0

log = logging.getLogger(__name__)


def worker_version(record: WorkerRecord) -> Hashable:
    """What is watched for change in a worker row: heartbeat, last update, metrics (all a KCL worker refreshes)."""
    return (record.heartbeat, record.last_update, tuple(record.metric_stats.items()))


def is_agent_row(record: WorkerRecord | None) -> bool:
    """True for a shardherd agent's row (it carries the `hb` counter); a KCL worker's row has none."""
    return record is not None and record.heartbeat > 0


@dataclass(frozen=True, slots=True)
class WorkerGrace:
    """How long a worker's row may stay unchanged before the worker counts as gone, per kind of worker.

    `receiver_*` is the stricter age up to which a live worker may still receive leases (it may have died a few
    seconds ago). `*_discovery` is how long a worker may take to find a lease newly assigned to it (lease mode: the
    lease's counter gets that much longer than a failover time to change for the first time).
    """

    agent: float
    kcl: float
    agent_receiver: float
    kcl_receiver: float
    agent_discovery: float
    kcl_discovery: float

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerGrace:
        """Agents heartbeat every heartbeat interval; KCL workers every `worker_metrics_reporter_freq_millis`."""
        failover = settings.failover_time_millis / 1000
        interval = settings.lease_assignment_interval_millis / 1000
        # A receiver must have shown a heartbeat within one heartbeat period plus 1.5 leader intervals (when the
        # leader sees it), at most the failover time: 6.3 s by default, 4.8 s on the local stack.
        receiver = min(failover, settings.effective_heartbeat_interval_millis / 1000 + 1.5 * interval)
        kcl = max(failover, 2 * settings.worker_metrics_reporter_freq_millis / 1000)
        return cls(agent=failover, kcl=kcl, agent_receiver=receiver, kcl_receiver=kcl,
                   agent_discovery=settings.discovery_interval_millis / 1000,
                   kcl_discovery=_KCL_DISCOVERY_FAILOVERS * failover)

    @classmethod
    def uniform(cls, seconds: float) -> WorkerGrace:
        """The same grace for every worker (tests and tools that know no better)."""
        return cls(seconds, seconds, seconds, seconds, 0.0, 0.0)

    def of(self, record: WorkerRecord | None) -> float:
        """Seconds the row may stay unchanged before the worker counts as gone."""
        return self.agent if is_agent_row(record) else self.kcl

    def receiver(self, record: WorkerRecord | None) -> float:
        """Seconds the row may stay unchanged while the worker may still receive leases."""
        return self.agent_receiver if is_agent_row(record) else self.kcl_receiver

    def discovery(self, record: WorkerRecord | None) -> float:
        """Seconds the worker may need to find a lease just assigned to it and renew it for the first time."""
        return self.agent_discovery if is_agent_row(record) else self.kcl_discovery


@dataclass(slots=True)
class _Seen:
    version: Hashable
    changed_at: float
    confirmed: bool = False  # the version changed at least once while watched: positive evidence of life
    learned_at: float | None = None  # when this process first read the version (changed_at may be earlier: see beats)


@dataclass
class ChangeWatcher:
    """Remembers, per key, when its observed version last changed; forgets keys that stop appearing."""

    _seen: dict[str, _Seen] = field(default_factory=dict)

    def observe(self, versions: Mapping[str, Hashable], now: float, unseen_start: float | None = None,
                starts: Mapping[str, float] | None = None, confirmed: Collection[str] = ()) -> None:
        """Record this run's versions; a new or changed key starts at `now`, or at `starts[key]` if earlier.

        A new key without a start starts at `unseen_start` if given.

        A new key in `confirmed` counts as seen changing already (this process watched it change before, e.g. while
        contending for the lock, on the same monotonic clock).
        """
        fresh: dict[str, _Seen] = {}
        for key, version in versions.items():
            previous = self._seen.get(key)
            if previous is None:
                start = now if unseen_start is None else unseen_start
                fresh[key] = _Seen(version, min(now, starts.get(key, start)) if starts else start,
                                   confirmed=key in confirmed, learned_at=now)
            elif previous.version != version:
                fresh[key] = _Seen(version, min(now, starts.get(key, now)) if starts else now, confirmed=True,
                                   learned_at=now)
            else:
                fresh[key] = previous
        self._seen = fresh

    def since(self, key: str) -> float | None:
        """When (observer's monotonic seconds) `key`'s version last changed, or None if it was not observed."""
        seen = self._seen.get(key)
        return None if seen is None else seen.changed_at

    def silent_for(self, key: str, now: float) -> float | None:
        """Seconds since `key`'s version last changed, or None if it was not observed."""
        seen = self._seen.get(key)
        return None if seen is None else now - seen.changed_at

    def unread_for(self, key: str, now: float) -> float | None:
        """Seconds since this process first read `key`'s current version, or None if it was not observed."""
        seen = self._seen.get(key)
        if seen is None:
            return None
        return now - (seen.changed_at if seen.learned_at is None else seen.learned_at)

    def confirmed(self, key: str) -> bool:
        """True once `key`'s version was seen changing (not merely present) while watched."""
        seen = self._seen.get(key)
        return seen is not None and seen.confirmed

    def set_changed(self, key: str, version: Hashable, now: float) -> None:
        """Record a change the leader caused itself (e.g. its own assignment), so the new owner gets a full period.

        `now` may lie ahead of the clock: the key then counts as changed until then (an allowance for discovery).
        """
        self._seen[key] = _Seen(version, now)


def heartbeat_age(watcher: ChangeWatcher, record: WorkerRecord, now: float, wall: float) -> float:
    """Seconds since the worker's row last changed, as the leader and the API report it.

    Once the row was seen changing, only the observer's monotonic clock counts. Before that (an observer that just
    started) the age is at least what the row's own `lut` says on the wall clock, so a long-dead row does not look
    fresh; this only ever makes a worker look older, never alive, so the leader's verdicts do not depend on it.
    """
    silent = watcher.silent_for(record.worker_id, now)
    observed = 0.0 if silent is None else silent
    if watcher.confirmed(record.worker_id):
        return max(0.0, observed)
    return max(0.0, observed, wall - record.last_update)


SIGHTINGS_FORMAT = 2  # the first byte of a publication; format 1 (JSON with whole worker ids) is no longer read
_DIGEST_BYTES = 3  # the shortest worker-id digest; longer when two published workers share one (see encode_sightings)
_MAX_DIGEST_BYTES = 8
_CHECK_BITS = 16  # per row: its `hb` and its `lut` modulo 2^16 each
_ENTRY_TAIL = 5  # after the digest: 4 bytes of check, 1 byte of quantised silence
_FINE_STEPS = 200  # silence codes 0-199: 0.1 s steps up to 19.9 s; codes 200-255: 2 s steps up to 130 s
_FINE = 0.1
_COARSE = 2.0


class MalformedSightings(ValueError):
    """A published `observedRows` value cannot be read (the new leader then starts from its own observations)."""


def _digest(worker_id: str) -> bytes:
    return hashlib.blake2b(worker_id.encode(), digest_size=_MAX_DIGEST_BYTES).digest()


def _check(heartbeat: int, last_update: int) -> int:
    """What a sighting keeps of a row's version: `hb` and `lut` modulo 2^16 each.

    A successor compares it within seconds of the publication (the lock's lease duration plus a run): a live agent's
    `hb` moves by one per heartbeat, so it cannot come round to the same value in that time (65,536 heartbeats); a
    restarted agent's new row has a `lut` seconds later; a KCL worker's `lut` (seconds) comes round after 18 hours.
    """
    mask = (1 << _CHECK_BITS) - 1
    return ((heartbeat & mask) << _CHECK_BITS) | (last_update & mask)


def _silence_code(seconds: float) -> int:
    """The silence rounded down to its code (so a decoded silence is still a lower bound)."""
    if seconds < _FINE_STEPS * _FINE:
        return max(0, int(seconds / _FINE + 1e-9))
    return min(255, _FINE_STEPS + int((seconds - _FINE_STEPS * _FINE) / _COARSE + 1e-9))


def _silence_seconds(code: int) -> float:
    if code < _FINE_STEPS:
        return code * _FINE
    return _FINE_STEPS * _FINE + (code - _FINE_STEPS) * _COARSE


def encode_sightings(rows: Mapping[str, tuple[int, int, float]], now: float, max_bytes: int) -> bytes | None:
    """The publication of `rows` (worker -> hb, lut, monotonic time the row last changed) as of `now`, in `max_bytes`.

    Binary, 8 bytes per worker: a digest of its id (3 bytes; the whole publication uses longer digests if two of its
    workers share one), the row's check (`_check`) and its silence rounded down (0.1 s steps to 20 s, then 2 s steps
    to 130 s). Workers silent longest come first: when not all fit, those left out are judged afresh by a successor
    (from its own watch), and a long-silent row is where a successor gains most. None when nothing fits.
    """
    order = sorted(rows, key=lambda worker: (rows[worker][2], worker))
    digests = {worker: _digest(worker) for worker in order}
    length = _DIGEST_BYTES
    while True:
        room = max(0, (max_bytes - 2) // (length + _ENTRY_TAIL))
        chosen = order[:room]
        if len({digests[worker][:length] for worker in chosen}) == len(chosen) or length == _MAX_DIGEST_BYTES:
            break
        length += 1
    if not chosen:
        return None
    out = bytearray((SIGHTINGS_FORMAT, length))
    for worker in chosen:
        heartbeat, last_update, changed_at = rows[worker]
        out += digests[worker][:length]
        out += _check(heartbeat, last_update).to_bytes(4, "big")
        out.append(_silence_code(now - changed_at))
    return bytes(out)


@dataclass(frozen=True, slots=True)
class Sightings:
    """A decoded publication: per worker-id digest, the row's check and how long it had been silent (seconds)."""

    digest_bytes: int
    entries: Mapping[bytes, tuple[int, float]]

    def __len__(self) -> int:
        return len(self.entries)

    def silences(self, records: Iterable[WorkerRecord]) -> dict[str, float]:
        """Worker -> published silence, for each row that is still exactly the one sighted.

        A row counts only if its id's digest and its check match an entry and no other row of `records` matches the
        same entry (an ambiguous digest: that worker is judged afresh, never guessed).
        """
        matches: dict[bytes, list[str]] = {}
        for record in records:
            digest = _digest(record.worker_id)[:self.digest_bytes]
            entry = self.entries.get(digest)
            if entry is not None and entry[0] == _check(record.heartbeat, record.last_update):
                matches.setdefault(digest, []).append(record.worker_id)
        return {workers[0]: self.entries[digest][1] for digest, workers in matches.items() if len(workers) == 1}


def decode_sightings(data: StateValue) -> Sightings:
    """Read a publication; MalformedSightings if it is not one this version writes."""
    if not isinstance(data, bytes) or len(data) < 2 or data[0] != SIGHTINGS_FORMAT:
        raise MalformedSightings(f"unknown sightings format: {str(data)[:40]!r}")
    length = data[1]
    size = length + _ENTRY_TAIL
    if not _DIGEST_BYTES <= length <= _MAX_DIGEST_BYTES or (len(data) - 2) % size:
        raise MalformedSightings(f"sightings of {len(data)} bytes do not hold whole {length}-byte-digest entries")
    entries: dict[bytes, tuple[int, float]] = {}
    seen: set[bytes] = set()
    for offset in range(2, len(data), size):
        digest = data[offset:offset + length]
        if digest in seen:  # two workers under one digest: neither can be told apart, both are judged afresh
            entries.pop(digest, None)
            continue
        seen.add(digest)
        check = int.from_bytes(data[offset + length:offset + length + 4], "big")
        entries[digest] = (check, _silence_seconds(data[offset + size - 1]))
    return Sightings(length, entries)


@dataclass(frozen=True, slots=True)
class LeaseLiveness:
    """One lease's verdict for this run."""

    expired: bool
    silent_seconds: float


@dataclass
class LivenessTracker:
    """Judges workers and leases for one leader term, in `worker` or `lease` mode."""

    mode: str
    failover_seconds: float
    grace: WorkerGrace
    workers: ChangeWatcher = field(default_factory=ChangeWatcher)
    leases: ChangeWatcher = field(default_factory=ChangeWatcher)
    owners: ChangeWatcher = field(default_factory=ChangeWatcher)
    records: dict[str, WorkerRecord] = field(default_factory=dict)  # the rows of the last observation
    handed_over: dict[str, tuple[int, int, float]] = field(default_factory=dict)  # see start_from
    handed_confirmed: set[str] = field(default_factory=set)  # handed-over rows this process saw changing
    published: tuple[Sightings, float] | None = None  # see take_over
    watching: bool = False  # observed once already: a worker row new since then was written in this term

    def take_over(self, sightings: Sightings, published_before: float) -> None:
        """Start from a predecessor's sightings, published no later than `published_before` (this clock).

        At the next observation a row that is still the one sighted (see `Sightings.silences`) counts as unchanged
        since `published_before - silent`; any other row is judged afresh.
        """
        self.published = (sightings, published_before)

    def start_from(self, rows: Mapping[str, tuple[int, int, float]], confirmed: Collection[str] = ()) -> None:
        """Add sightings (worker -> hb, lut, unchanged since) for the next observation; the newer row wins.

        For the same `hb` and `lut` the earlier start is kept (both are lower bounds of the row's silence); of two
        different rows, the one sighted later (the contending watch's, or one an agent named on the channel). Workers in
        `confirmed` were seen changing by this process (its own watch, same clock), or named their row in a request on
        the channel (only a live agent makes one): still the row sighted, they are alive at once instead of after
        their next heartbeat (a new leader's receivers for a dead worker's leases; a new stack's agents).
        """
        for worker, (heartbeat, last_update, since) in rows.items():
            known = self.handed_over.get(worker)
            if known is not None and known[:2] == (heartbeat, last_update):
                since = min(since, known[2])
            elif known is not None and known[2] > since:
                continue  # a row sighted later is already known: this one is older
            self.handed_over[worker] = (heartbeat, last_update, since)
        self.handed_confirmed |= set(confirmed) & rows.keys()

    def confirmed_workers(self) -> set[str]:
        """The workers whose rows this tracker saw changing (positive evidence of life, on this process's clock)."""
        return {worker for worker in self.records if self.workers.confirmed(worker)}

    def row_sightings(self) -> dict[str, tuple[int, int, float]]:
        """Worker -> (hb, lut, when its row last changed) as of the last observation: what a leader publishes."""
        sightings = {}
        for worker, record in self.records.items():
            since = self.workers.since(worker)
            if since is not None:
                sightings[worker] = (record.heartbeat, record.last_update, since)
        return sightings

    def _written_in_term(self, records: Iterable[WorkerRecord]) -> set[str]:
        """Rows first seen after the term's first observation: written since, so seen changing (decision 0038)."""
        if not self.watching:
            return set()
        return {w.worker_id for w in records if self.workers.since(w.worker_id) is None}

    def observe(self, leases: Iterable[Lease], workers: Iterable[WorkerRecord], now: float) -> None:
        """Record this run's counters and heartbeats."""
        records = list(workers)
        self.records = {w.worker_id: w for w in records}
        starts = {w.worker_id: self.handed_over[w.worker_id][2] for w in records
                  if self.handed_over.get(w.worker_id, (None, None))[:2] == (w.heartbeat, w.last_update)}
        confirmed = self.handed_confirmed & starts.keys()
        if self.published is not None:
            sightings, published_before = self.published
            matched = sightings.silences(records)
            log.info("liveness: starting from the previous leader's sightings: %d of %d rows still as sighted",
                     len(matched), len(sightings))
            for worker, silent in matched.items():
                starts[worker] = min(starts.get(worker, published_before), published_before - silent)
        confirmed |= self._written_in_term(records)
        self.handed_over, self.handed_confirmed, self.published, self.watching = {}, set(), None, True
        self.workers.observe({w.worker_id: worker_version(w) for w in records}, now, starts=starts,
                             confirmed=confirmed)
        lease_list = list(leases)
        if self.mode == "lease":
            self.leases.observe({lease.lease_key: lease.lease_counter for lease in lease_list}, now)
        else:
            # An owner with no worker record at all (crashed before its first heartbeat, or a record deleted) is
            # watched under a constant version so it expires one failover after the leader first saw it.
            known = {w.worker_id for w in records}
            owners = {lease.actual_owner for lease in lease_list}
            self.owners.observe({owner: "absent" for owner in owners if owner and owner not in known}, now)

    def worker_alive(self, worker_id: str, now: float) -> bool:
        """True if the worker's heartbeat (or metrics record) was seen changing, most recently within the grace period.

        A worker merely present in the table is not yet alive for a new leader: a dead worker's last record looks
        just like a live one until it fails to change, and leases must not be handed to it in the meantime.
        """
        silent = self.workers.silent_for(worker_id, now)
        return (silent is not None and silent <= self.grace.of(self.records.get(worker_id))
                and self.workers.confirmed(worker_id))

    def next_verdict(self, now: float, quiet: float) -> float | None:
        """When the first worker whose row has been unchanged for over `quiet` seconds would count as gone.

        A run at that moment moves a dead worker's leases at once, instead of at the next interval's run (up to an
        interval later). Workers that wrote within `quiet` (their heartbeat period) are left out: they beat on; so are
        workers already gone. A row a new leader has not yet seen change counts too: after a takeover the dead
        worker's row is usually one of these, and its verdict must not wait for the next interval's run either.
        """
        due = [since + grace for worker in self.records
               if (since := self.workers.since(worker)) is not None
               and quiet < now - since <= (grace := self.grace.of(self.records.get(worker)))]
        return min(due) if due else None

    def worker_receives(self, worker_id: str, now: float) -> bool:
        """True if the worker's row changed recently enough that it may be handed leases (see WorkerGrace).

        Counted from when this leader read the row's version (the grace allows for the leader's lag in seeing it),
        not from the earlier time a request on the channel named it: that makes a row older, never younger, and
        would hold back receivers whose heartbeat writes are slow.
        """
        silent = self.workers.unread_for(worker_id, now)
        return silent is not None and silent <= self.grace.receiver(self.records.get(worker_id))

    def worker_silent(self, worker_id: str, now: float) -> bool:
        """True if the leader has watched the worker's record stay unchanged for longer than the grace period.

        Stronger than `not worker_alive`: a worker a new leader has not yet watched for a whole grace period is
        neither alive nor silent, so nothing is decided from a record it merely found in the table.
        """
        silent = self.workers.silent_for(worker_id, now)
        return silent is not None and silent > self.grace.of(self.records.get(worker_id))

    def agents_undecided(self, now: float) -> bool:
        """Whether an agent row of the last observation is neither alive nor silent: found, not yet seen changing.

        Every running agent rewrites its row each heartbeat interval, so at a term's start these are the agents the
        leader has not yet watched for one (or dead ones' last rows, until their grace passes). KCL workers' rows
        are left out: they change only every reporter interval, too long to wait for.
        """
        return any(is_agent_row(record) and not self.worker_alive(worker, now) and not self.worker_silent(worker, now)
                   for worker, record in self.records.items())

    def lease(self, lease: Lease, now: float) -> LeaseLiveness:
        """Whether `lease` has expired: unowned, or its owner (mode `worker`) / counter (mode `lease`) went silent."""
        owner = lease.actual_owner
        if owner is None:
            return LeaseLiveness(True, self.failover_seconds * 3)
        if self.mode == "lease":
            silent = self.leases.silent_for(lease.lease_key, now)
        else:
            silent = self.workers.silent_for(owner, now)
            if silent is None:
                silent = self.owners.silent_for(owner, now)
        if silent is None:
            return LeaseLiveness(False, 0.0)
        return LeaseLiveness(silent > self.failover_seconds, max(0.0, silent))

    def assigned(self, lease_key: str, counter: int, owner: str, now: float) -> None:
        """The leader just gave `lease_key` to `owner` at `counter`.

        In lease mode the owner gets a full failover period after it can have found the lease: its discovery
        allowance (WorkerGrace.discovery) plus the failover time to show its first renewal. A Java KCL worker finds
        a lease up to about one failover time after it was assigned; one failover time alone made the leader take
        such leases back before their new owner had a chance to renew them.
        """
        if self.mode == "lease":
            self.leases.set_changed(lease_key, counter, now + self.grace.discovery(self.records.get(owner)))
