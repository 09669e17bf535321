"""The assignment decider's entry point: a pure function from (snapshot, config, balance?) to a Plan."""

from __future__ import annotations

from coordinator.decider_config import DeciderConfig, Strategy
from coordinator.lease_count import LeaseCountDecider
from coordinator.metric_basis import on_common_basis
from coordinator.moves import Plan
from coordinator.snapshot import Snapshot
from coordinator.variance import VarianceDecider


def decide(snapshot: Snapshot, config: DeciderConfig, balance: bool) -> Plan:
    """Plan one leader run: place unassigned/expired leases, drain, and balance if `balance` (every Nth run).

    Pure and deterministic: no I/O, clock or randomness; the same snapshot and config always give the same plan.
    A fleet whose workers report different metric kinds is balanced on the kinds they share (metric_basis).
    """
    snapshot = on_common_basis(snapshot)
    if config.strategy is Strategy.LEASE_COUNT:
        return LeaseCountDecider(snapshot, config).plan(balance)
    return VarianceDecider(snapshot, config).plan(balance)
