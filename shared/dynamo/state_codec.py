"""Coordinator-state values (str, int, bytes) <-> DynamoDB attribute values, and StateCondition -> condition."""

from __future__ import annotations

from collections.abc import Mapping

from shardherd.shared.dynamo.attributes import AttributeTypeError, parse_integer
from shardherd.shared.dynamo.expressions import AttributeValue, Expression, Item
from shardherd.shared.errors import StoreError
from shardherd.shared.store import STATE_KEY_ATTRIBUTE, StateCondition, StateValue


def state_key(key: str) -> dict[str, AttributeValue]:
    """The primary key of a coordinator-state item."""
    return {STATE_KEY_ATTRIBUTE: {"S": key}}


def encode_value(value: StateValue) -> AttributeValue:
    """S for str, N for int, B for bytes; TypeError for anything else (bool included)."""
    if isinstance(value, bool) or not isinstance(value, str | int | bytes):
        raise TypeError(f"coordinator state values are str, int or bytes, not {type(value).__name__}")
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, int):
        return {"N": str(value)}
    return {"B": value}


def decode_value(key: str, name: str, value: AttributeValue) -> StateValue:
    """The Python value of one stored attribute; StoreError for types shardherd never writes."""
    if isinstance(value, dict) and len(value) == 1:
        (type_code, payload), = value.items()
        if type_code == "S" and isinstance(payload, str):
            return payload
        if type_code == "B" and isinstance(payload, bytes | bytearray):
            return bytes(payload)
        if type_code == "N" and isinstance(payload, str):
            try:
                return parse_integer(name, payload)
            except AttributeTypeError as exc:
                raise StoreError(f"coordinator state {key!r}: {exc}") from None
    raise StoreError(f"coordinator state {key!r}: attribute {name} has an unsupported type {list(value)}")


def encode_state(key: str, attributes: Mapping[str, StateValue]) -> dict[str, AttributeValue]:
    """The whole item: the hash key plus every attribute (which must not name the hash key)."""
    if STATE_KEY_ATTRIBUTE in attributes:
        raise ValueError(f"the attributes of coordinator state {key!r} must not include the hash key "
                         f"{STATE_KEY_ATTRIBUTE!r}")
    item = state_key(key)
    item.update({name: encode_value(value) for name, value in attributes.items()})
    return item


def decode_state(item: Item) -> dict[str, StateValue]:
    """The attributes of a stored item without its hash key."""
    key = str(item.get(STATE_KEY_ATTRIBUTE, {}).get("S"))
    return {name: decode_value(key, name, value) for name, value in item.items() if name != STATE_KEY_ATTRIBUTE}


def add_condition(expression: Expression, condition: StateCondition | None) -> Expression:
    """Add each `attribute -> value` (equal) or `attribute -> None` (absent) requirement to `expression`."""
    for name, value in (condition or {}).items():
        if value is None:
            expression.require_absent(name)
        else:
            expression.require_equal(name, encode_value(value))
    return expression
