"""Coordinator-state items as JSON documents with DynamoDB-style type tags, and evaluation of StateConditions."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping

from shardherd.shared.errors import StoreError
from shardherd.shared.state_conditions import check_value
from shardherd.shared.store import StateValue


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
