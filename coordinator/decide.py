"""The assignment decider's entry point: a pure function from (snapshot, config, balance?) to a Plan.

The strategy is chosen by name (`DeciderConfig.strategy`) among the sibling modules of coordinator/deciders/, each
implementing the `Decider` protocol (coordinator/deciders/protocol.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from shardherd.coordinator.decider_config import DeciderConfig, Strategy
from shardherd.coordinator.deciders.band import BandDecider
from shardherd.coordinator.deciders.kcl_variance import KclVarianceDecider
from shardherd.coordinator.deciders.lease_count import LeaseCountDecider
from shardherd.coordinator.deciders.protocol import Decider
from shardherd.coordinator.metric_basis import on_common_basis
from shardherd.coordinator.moves import Plan
from shardherd.coordinator.snapshot import Snapshot

# Every strategy by its name; `Strategy` lists exactly these names (tests/coordinator/test_decide.py checks it).
DECIDERS: Mapping[Strategy, Decider] = {
    Strategy(decider.name): decider for decider in (BandDecider(), KclVarianceDecider(), LeaseCountDecider())
}


def decide(snapshot: Snapshot, config: DeciderConfig, balance: bool) -> Plan:
    """Plan one leader run: place unassigned/expired leases, drain, and balance if `balance` (every Nth run).

    Pure and deterministic: no I/O, clock or randomness; the same snapshot and config always give the same plan.
    A fleet whose workers report different metric kinds is balanced on the kinds they share (metric_basis).
    """
    return DECIDERS[config.strategy].plan(on_common_basis(snapshot), config, balance)
