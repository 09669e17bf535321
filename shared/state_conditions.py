"""Coordinator-state values and conditions checked in Python, for the backends without native conditions."""

from __future__ import annotations

from collections.abc import Mapping

from shardherd.shared.errors import StoreError
from shardherd.shared.store import STATE_KEY_ATTRIBUTE, StateCondition, StateValue


def check_value(attribute: str, value: object) -> StateValue:
    """A state value as given by a caller for an attribute: str, int (not bool) or bytes; StoreError otherwise."""
    if attribute == STATE_KEY_ATTRIBUTE:
        raise StoreError(f"{STATE_KEY_ATTRIBUTE!r} is the hash key of a coordinator-state item, not an attribute")
    return _require_type(f"coordinator-state attribute {attribute!r}", value)


def _require_type(what: str, value: object) -> StateValue:
    """`value` if it is a str, int (not bool) or bytes; StoreError naming `what` otherwise."""
    if isinstance(value, bool) or not isinstance(value, str | int | bytes):
        raise StoreError(f"{what} must be str, int or bytes, got {type(value).__name__}")
    return value


def condition_holds(key: str, item: Mapping[str, StateValue] | None, condition: StateCondition | None) -> bool:
    """True if the item (None = absent) satisfies every attribute requirement; `key` names the item's existence."""
    for attribute, expected in (condition or {}).items():
        if attribute == STATE_KEY_ATTRIBUTE:
            actual: StateValue | None = key if item is not None else None
        else:
            actual = item.get(attribute) if item is not None else None
        if expected is not None:
            _require_type(f"condition on {attribute!r}", expected)
        if type(actual) is not type(expected) or actual != expected:
            return False
    return True
