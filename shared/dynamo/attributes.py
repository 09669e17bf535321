"""Typed readers and writers of single DynamoDB attribute values, shared by the lease and worker codecs."""

from __future__ import annotations

import math
from collections.abc import Iterable
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from shardherd.shared.dynamo.expressions import AttributeValue, Item

_MICRO = Decimal("0.000001")


class AttributeTypeError(ValueError):
    """An attribute has the wrong DynamoDB type or an unreadable value; the codecs turn it into a Malformed* error."""


def _typed(item: Item, name: str, type_code: str) -> object | None:
    """The raw payload of attribute `name` if present, checking its type code; None if absent."""
    value = item.get(name)
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) != 1 or type_code not in value:
        found = "/".join(value) if isinstance(value, dict) else type(value).__name__
        raise AttributeTypeError(f"{name} must be of type {type_code}, found {found}")
    payload: object = value[type_code]
    return payload


def read_string(item: Item, name: str) -> str | None:
    """An S attribute, or None when absent."""
    payload = _typed(item, name, "S")
    if payload is not None and not isinstance(payload, str):
        raise AttributeTypeError(f"{name} is not a string")
    return payload


def read_number_text(item: Item, name: str) -> str | None:
    """The decimal text of an N attribute, or None when absent."""
    payload = _typed(item, name, "N")
    if payload is not None and not isinstance(payload, str):
        raise AttributeTypeError(f"{name} is not a number string")
    return payload


def parse_decimal(name: str, text: str) -> Decimal:
    """A finite Decimal from a stored number's text."""
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise AttributeTypeError(f"{name} is not a number: {text[:40]!r}") from None
    if not number.is_finite():
        raise AttributeTypeError(f"{name} is not a finite number: {text[:40]!r}")
    return number


def parse_integer(name: str, text: str) -> int:
    """An integer from a stored number's text; fractional values are rejected."""
    number = parse_decimal(name, text)
    if number != number.to_integral_value():
        raise AttributeTypeError(f"{name} must be an integer, found {text[:40]!r}")
    return int(number)


def read_int(item: Item, name: str) -> int | None:
    """An integral N attribute, or None when absent."""
    text = read_number_text(item, name)
    return None if text is None else parse_integer(name, text)


def read_float(item: Item, name: str) -> float | None:
    """An N attribute as a float, or None when absent."""
    text = read_number_text(item, name)
    return None if text is None else float(parse_decimal(name, text))


def read_string_set(item: Item, name: str) -> frozenset[str]:
    """An SS attribute; the empty set when absent."""
    payload = _typed(item, name, "SS")
    if payload is None:
        return frozenset()
    if not isinstance(payload, list) or not all(isinstance(entry, str) for entry in payload):
        raise AttributeTypeError(f"{name} is not a list of strings")
    return frozenset(payload)


def read_bytes(item: Item, name: str) -> bytes | None:
    """A B attribute, or None when absent."""
    payload = _typed(item, name, "B")
    if payload is not None and not isinstance(payload, bytes | bytearray):
        raise AttributeTypeError(f"{name} is not binary")
    return None if payload is None else bytes(payload)


def read_bool(item: Item, name: str) -> bool | None:
    """A BOOL attribute, or None when absent."""
    payload = _typed(item, name, "BOOL")
    if payload is not None and not isinstance(payload, bool):
        raise AttributeTypeError(f"{name} is not a boolean")
    return payload


def string(value: str) -> AttributeValue:
    """An S attribute value."""
    return {"S": value}


def integer(value: int) -> AttributeValue:
    """An N attribute value holding an integer."""
    return {"N": str(value)}


def number_text(value: float) -> str:
    """The decimal text DynamoDB stores for a finite float (no exponent; ValueError for NaN or infinity)."""
    if not math.isfinite(value):
        raise ValueError(f"cannot store the non-finite number {value!r}")
    text = format(Decimal(repr(float(value))), "f")
    return text[:-2] if text.endswith(".0") else text


def number(value: float) -> AttributeValue:
    """An N attribute value holding a float."""
    return {"N": number_text(value)}


def rounded_micro(value: float) -> AttributeValue:
    """An N attribute rounded HALF_UP to 6 decimals, as KCL stores throughput."""
    if not math.isfinite(value):
        raise ValueError(f"cannot store the non-finite number {value!r}")
    rounded = Decimal(repr(float(value))).quantize(_MICRO, rounding=ROUND_HALF_UP).normalize()
    text = format(rounded, "f")
    return {"N": "0" if rounded.is_zero() else text}


def string_set(values: Iterable[str]) -> AttributeValue:
    """An SS attribute value (sorted, so the stored order is stable); callers omit empty sets."""
    return {"SS": sorted(values)}
