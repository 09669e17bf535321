"""The leader's liveness observations: who is alive and which leases expired, judged on the leader's own clock.

Nothing here compares clocks of different machines. The leader remembers, per lease (mode `lease`) or per worker (mode
`worker`), the last value of a counter it saw and when (its monotonic time) that value last changed. Something whose
value has not changed for the failover time is expired. A newly seen owned lease or worker counts as freshly renewed,
so after a leader change nothing expires until the new leader has watched it for a failover period (as in KCL).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from shared.lease import Lease
from shared.worker import WorkerRecord


@dataclass(slots=True)
class _Seen:
    version: Hashable
    changed_at: float
    confirmed: bool = False  # the version changed at least once while watched: positive evidence of life


@dataclass
class ChangeWatcher:
    """Remembers, per key, when its observed version last changed; forgets keys that stop appearing."""

    _seen: dict[str, _Seen] = field(default_factory=dict)

    def observe(self, versions: Mapping[str, Hashable], now: float, unseen_start: float | None = None) -> None:
        """Record this run's versions; a new key starts at `now` (or `unseen_start`, e.g. long ago for unowned)."""
        fresh: dict[str, _Seen] = {}
        for key, version in versions.items():
            previous = self._seen.get(key)
            if previous is None:
                fresh[key] = _Seen(version, now if unseen_start is None else unseen_start)
            elif previous.version != version:
                fresh[key] = _Seen(version, now, confirmed=True)
            else:
                fresh[key] = previous
        self._seen = fresh

    def silent_for(self, key: str, now: float) -> float | None:
        """Seconds since `key`'s version last changed, or None if it was not observed."""
        seen = self._seen.get(key)
        return None if seen is None else now - seen.changed_at

    def confirmed(self, key: str) -> bool:
        """True once `key`'s version was seen changing (not merely present) while watched."""
        seen = self._seen.get(key)
        return seen is not None and seen.confirmed

    def set_changed(self, key: str, version: Hashable, now: float) -> None:
        """Record a change the leader caused itself (e.g. its own assignment), so the new owner gets a full period."""
        self._seen[key] = _Seen(version, now)


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
    worker_grace_seconds: float
    workers: ChangeWatcher = field(default_factory=ChangeWatcher)
    leases: ChangeWatcher = field(default_factory=ChangeWatcher)
    owners: ChangeWatcher = field(default_factory=ChangeWatcher)

    def observe(self, leases: Iterable[Lease], workers: Iterable[WorkerRecord], now: float) -> None:
        """Record this run's counters and heartbeats."""
        records = list(workers)
        self.workers.observe({w.worker_id: (w.heartbeat, w.last_update, tuple(w.metric_stats.items()))
                              for w in records}, now)
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
        return silent is not None and silent <= self.worker_grace_seconds and self.workers.confirmed(worker_id)

    def worker_silent(self, worker_id: str, now: float) -> bool:
        """True if the leader has watched the worker's record stay unchanged for longer than the grace period.

        Stronger than `not worker_alive`: a worker a new leader has not yet watched for a whole grace period is
        neither alive nor silent, so nothing is decided from a record it merely found in the table.
        """
        silent = self.workers.silent_for(worker_id, now)
        return silent is not None and silent > self.worker_grace_seconds

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
        return LeaseLiveness(silent > self.failover_seconds, silent)

    def assigned(self, lease_key: str, counter: int, now: float) -> None:
        """The leader just gave `lease_key` a new owner at `counter`: the owner gets a full failover period."""
        if self.mode == "lease":
            self.leases.set_changed(lease_key, counter, now)
