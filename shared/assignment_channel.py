"""What the coordinator channel carries between the leader and an agent: a worker's leases and its feed position.

The leader's feed (coordinator/assignment_feed.py) computes these from its lease view and serves them at
`GET /v1/workers/{id}/assignments/changes`; the agent's watch (agent/assignment_watch.py) reads them.

Invariants:
* A lease relates to a worker in at most one way: during a handoff (`checkpointOwner` set) it `hands_off` for the
  checkpoint owner and `receives` for the lease owner (when that is another worker); otherwise it `owns` for the lease
  owner. A lease without an owner relates to nobody.
* A position is (feed, version, leases): the feed names one leader term of one replica, so versions of different
  feeds are never compared; within a feed a worker's version grows whenever its leases change.
* A paused lease's relation carries PAUSED_MARK (`owns+paused`), so its owner re-reads the row when a pause starts
  or ends (shared/pause.py); `base_relation` strips it.
* The channel is advice: an agent reads every lease it starts or stops from the store, so a stale position can delay
  a pickup but never make a worker process a lease it does not own.
* A position also carries the leader's verdict on a fleet-wide stall (`fleet_stalls`, coordinator/fleet_stall.py) as
  of its latest full run. A change of it moves no version: every listening request is answered within a heartbeat
  period anyway, and an agent takes the verdict only while answers keep coming (agent/stall_watch.FleetVerdict).
* Likewise the leases of the worker whose reads stalled at two workers or more (`shard_stalls`,
  coordinator/shard_stall.py): only the worker's own (those it owns, receives or hands off), so an answer stays
  small; a change of them answers the worker at once and moves no version.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shardherd.shared.lease import Lease

# A lease's relation to a worker: it owns and processes it, receives it (handoff running), or hands it off.
OWNS = "owns"
RECEIVES = "receives"
HANDS_OFF = "hands_off"
PAUSED_MARK = "+paused"


def base_relation(relation: str) -> str:
    """The relation without its pause mark."""
    return relation.removesuffix(PAUSED_MARK)


@dataclass(frozen=True, slots=True)
class FeedPosition:
    """A worker's place in a feed: the feed's name, the worker's version and its leases (key -> relation).

    Plus the leader's verdict that most lease-holding workers stall at once (`fleet_stalls`, decision 0039), and
    which of the worker's leases stalled at two workers or more (`shard_stalls`, decision 0043).
    """

    feed: str
    version: int
    leases: dict[str, str]
    fleet_stalls: bool = False
    shard_stalls: frozenset[str] = frozenset()


def relations(leases: Iterable[Lease]) -> dict[str, dict[str, str]]:
    """Worker -> (lease key -> relation) for every lease that names the worker as owner or checkpoint owner."""
    result: dict[str, dict[str, str]] = {}
    for lease in leases:
        mark = PAUSED_MARK if lease.is_paused else ""
        if lease.checkpoint_owner is not None:
            result.setdefault(lease.checkpoint_owner, {})[lease.lease_key] = HANDS_OFF + mark
            if lease.lease_owner is not None and lease.lease_owner != lease.checkpoint_owner:
                result.setdefault(lease.lease_owner, {})[lease.lease_key] = RECEIVES + mark
        elif lease.lease_owner is not None:
            result.setdefault(lease.lease_owner, {})[lease.lease_key] = OWNS + mark
    return result
