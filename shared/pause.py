"""Pausing a shard: where the pause is stored, how its owner learns of it, and which leases a request names.

Invariants (decision 0031):
* The pause lives in the lease row and nowhere else: `shardherdPaused` holds the operator's reason and
  `shardherdPausedBy` the worker that stopped processing for it. Both survive leader and worker restarts; a new owner
  (after a failover) reads them when it acquires the lease and stays paused.
* Setting or clearing a pause changes neither owner nor counter, so renewals (ours and a KCL worker's) go on; KCL
  ignores attributes it does not know and its updates keep them, so a KCL-format table stays readable by KCL. A KCL
  worker does not honour a pause: pausing is for shards shardherd agents process.
* A paused lease stays assigned: the leader neither rebalances it nor counts it idle or stuck; only a failover (its
  owner died) or a drain moves it, and the new owner stays paused.
* The owner learns of a pause from any row it reads or writes (checkpoint and renewal replies), from the coordinator
  channel's pause mark on the lease, and, for a paused lease, from a re-read every discovery interval (a resume).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from shardherd.shared.assignment_channel import PAUSED_MARK
from shardherd.shared.errors import ShardherdError
from shardherd.shared.lease import Lease
from shardherd.shared.streams import stream_name_of

MAX_REASON = 256
DEFAULT_REASON = "paused by an operator"


class BadControlRequest(ShardherdError):
    """An operator control (pause, resume, rewind) names nothing, too much, or something that does not exist."""


def pause_reason(text: str | None) -> str:
    """The reason to store: the default for none, stripped; BadControlRequest for one too long or multi-line."""
    reason = (text or "").strip() or DEFAULT_REASON
    if len(reason) > MAX_REASON or "\n" in reason:
        raise BadControlRequest(f"a pause reason is one line of at most {MAX_REASON} characters")
    return reason


def pause_rechecks(held: Mapping[str, Lease], owned: Collection[str], told: Mapping[str, str]) -> set[str]:
    """Held leases whose pause mark in the coordinator's view (`told`) differs from the row last seen: re-read them."""
    return {key for key in set(held).intersection(owned)
            if told.get(key, "").endswith(PAUSED_MARK) != held[key].is_paused}


def select_leases(leases: Collection[Lease], shards: Collection[str] = (),
                  streams: Collection[str] = ()) -> list[Lease]:
    """The leases a request names: by lease key or shard id, or every lease of the named streams.

    BadControlRequest when it names nothing, or a shard or stream no lease has (nothing is written then).
    """
    if not shards and not streams:
        raise BadControlRequest("name at least one shard or stream")
    chosen: dict[str, Lease] = {}
    for name in shards:
        found = [lease for lease in leases if name in (lease.lease_key, lease.shard)]
        if not found:
            raise BadControlRequest(f"no lease for shard {name!r}")
        chosen.update((lease.lease_key, lease) for lease in found)
    for stream in streams:
        found = [lease for lease in leases if stream_name_of(lease) == stream]
        if not found:
            raise BadControlRequest(f"no lease of stream {stream!r}")
        chosen.update((lease.lease_key, lease) for lease in found)
    return [chosen[key] for key in sorted(chosen)]
