"""What the API renders from one judged fleet, kept while that fleet is served: built once, not once per call.

A fleet (services/api/fleet.py) is immutable once judged and a snapshot serves the same object until its tables are
replaced, so anything computed from it alone (a `/metrics` exposition's fleet families, a page of `/v1/assignments`
before its per-call fields) is the same for every call that gets it.

Invariants:
1. A value is computed from its fleet alone, and kept only with that fleet object (held, so it cannot be another
   fleet at the same address): a newer fleet never gets an older fleet's value.
2. At most FLEETS fleets and PER_FLEET values per fleet are held (a replica serves two fleets at once at most: the
   leader's view to anonymous callers, tables read for callers with a token); the oldest fleet, or a fleet's values
   once full, are dropped, never reused.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from shardherd.services.api.fleet import Fleet

T = TypeVar("T")
FLEETS = 2
PER_FLEET = 64


class PerFleet:
    """Values computed from a fleet, by key, for the newest FLEETS fleets asked about (thread-safe)."""

    def __init__(self) -> None:
        self._held: list[tuple[Fleet, dict[Hashable, Any]]] = []  # newest last
        self._guard = threading.Lock()

    def get(self, fleet: Fleet, key: Hashable, make: Callable[[], T]) -> T:
        """The value `make()` gave for this fleet and key, computing it (outside the guard) the first time."""
        values = self._values(fleet)
        if key in values:
            value: T = values[key]
            return value
        value = make()
        with self._guard:
            if len(values) >= PER_FLEET:
                values.clear()
            values[key] = value
        return value

    def _values(self, fleet: Fleet) -> dict[Hashable, Any]:
        with self._guard:
            for held, values in self._held:
                if held is fleet:
                    return values
            values = {}
            self._held = [*self._held[len(self._held) + 1 - FLEETS:], (fleet, values)]
            return values
