"""The `Decider` protocol every assignment strategy implements: snapshot in, plan out, pure.

A strategy is a sibling module of this package with one object that has a `name` (the value of
`DeciderConfig.strategy` that chooses it) and a `plan` method. `plan` must not do I/O, read a clock or draw random
numbers: the same snapshot and config always give the same plan, so the leader's runs can be replayed and tested
without a store (coordinator/decide.py picks the strategy; coordinator/leader_loop.py writes the plan).
"""

from __future__ import annotations

from typing import Protocol

from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.moves import Plan
from shardherd.coordinator.snapshot import Snapshot


class Decider(Protocol):
    """An assignment strategy: which lease goes to which worker for one leader run."""

    @property
    def name(self) -> str:
        """The strategy's name in config (`DeciderConfig.strategy`) and in the plan it returns."""
        ...

    def plan(self, snapshot: Snapshot, config: DeciderConfig, balance: bool) -> Plan:
        """Place unassigned and expired leases, drain draining workers, and balance if `balance` (every Nth run)."""
        ...
