"""The leader's rule for paused leases: they stay with their owner unless that owner is gone or draining.

Invariant (shared/pause.py): a paused lease is neither rebalanced nor treated as idle; the decider's balancing moves
of paused leases are dropped (and listed as held, with the reason), while placing an unowned lease, failing over an
expired one and draining a worker still move it (its new owner stays paused).
"""

from __future__ import annotations

from collections.abc import Mapping

from shardherd.coordinator.moves import Plan, UnplacedReason
from shardherd.shared.lease import Lease


def hold_paused(plan: Plan, leases: Mapping[str, Lease]) -> Plan:
    """The plan without balancing moves of paused leases; each dropped move becomes a held entry."""

    def paused(key: str) -> bool:
        lease = leases.get(key)
        return lease is not None and lease.is_paused

    return plan.hold_balancing(paused, UnplacedReason.PAUSED, "paused by an operator: stays with its owner")
