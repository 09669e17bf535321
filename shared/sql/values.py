"""Typed readers for stored column values: each raises ValueError with a message naming what was wrong."""

from __future__ import annotations

import json
import math


def read_int(value: object, default: int | None = None) -> int:
    """An integer column; `default` when NULL (or ValueError if the column is required)."""
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {_show(value)}")
    return value


def read_optional_int(value: object) -> int | None:
    """An integer column that may be NULL."""
    return None if value is None else read_int(value)


def read_optional_str(value: object) -> str | None:
    """A text column that may be NULL."""
    if value is not None and not isinstance(value, str):
        raise ValueError(f"expected a string, got {_show(value)}")
    return value


def read_number(value: object) -> float | None:
    """A numeric column that may be NULL."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {_show(value)}")
    return float(value)


def read_bytes(value: object) -> bytes | None:
    """A binary column that may be NULL (drivers may hand back memoryview)."""
    if value is None:
        return None
    if isinstance(value, memoryview):
        return value.tobytes()
    if not isinstance(value, bytes):
        raise ValueError(f"expected bytes, got {_show(value)}")
    return value


def read_json(value: object) -> object:
    """Parse a JSON text column (NULL gives None)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"expected JSON text, got {_show(value)}")
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg} at {exc.pos})") from exc


def read_string_set(value: object) -> frozenset[str]:
    """A string set stored as a JSON array (NULL = empty set, as DynamoDB omits empty sets)."""
    parsed = read_json(value)
    if parsed is None:
        return frozenset()
    if not isinstance(parsed, list) or not all(isinstance(item, str) for item in parsed):
        raise ValueError(f"expected a JSON array of strings, got {_show(parsed)}")
    return frozenset(parsed)


def write_string_set(values: frozenset[str]) -> str | None:
    """A string set as a sorted JSON array, or None (column NULL) when empty."""
    return json.dumps(sorted(values)) if values else None


def _show(value: object) -> str:
    """A short description of an unexpected value for error messages."""
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"
