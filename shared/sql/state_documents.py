"""Coordinator-state items as JSON documents with DynamoDB-style type tags, and evaluation of StateConditions."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping

from shared.errors import StoreError
from shared.store import STATE_KEY_ATTRIBUTE, StateCondition, StateValue


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


def encode_document(attributes: Mapping[str, StateValue]) -> str:
    """`{"name": {"S": text} | {"N": "digits"} | {"B": base64}}` with sorted keys."""
    document: dict[str, dict[str, str]] = {}
    for name, value in attributes.items():
        checked = check_value(name, value)
        if isinstance(checked, bytes):
            document[name] = {"B": base64.b64encode(checked).decode("ascii")}
        elif isinstance(checked, int):
            document[name] = {"N": str(checked)}
        else:
            document[name] = {"S": checked}
    return json.dumps(document, sort_keys=True)


def decode_document(key: str, text: str) -> dict[str, StateValue]:
    """The attributes of a stored document; StoreError naming the item when it cannot be read."""
    try:
        document = json.loads(text)
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        return {name: _decode_value(tagged) for name, tagged in document.items()}
    except (ValueError, TypeError, binascii.Error) as exc:
        raise StoreError(f"coordinator-state item {key!r} is unreadable: {exc}") from exc


def _decode_value(tagged: object) -> StateValue:
    """One `{"S"|"N"|"B": ...}` value."""
    if not isinstance(tagged, dict) or len(tagged) != 1:
        raise ValueError(f"expected one type tag, got {tagged!r}")
    ((tag, raw),) = tagged.items()
    if not isinstance(raw, str):
        raise ValueError(f"tagged value must be a string, got {raw!r}")
    if tag == "S":
        return raw
    if tag == "N":
        return int(raw)
    if tag == "B":
        return base64.b64decode(raw, validate=True)
    raise ValueError(f"unknown type tag {tag!r}")


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
