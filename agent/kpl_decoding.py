"""Which KPL aggregate decoder this process uses, chosen once: the protobuf runtime's C one, else pure Python.

`auto` (the default) takes agent/kpl_protobuf.py when `protobuf` is importable and its implementation is upb (C);
any other runtime (the pure-Python protobuf, the old C++ one, or none) falls back to agent/kpl_python.py. `python`
forces the fallback: set SHARDHERD_KPL_DECODER=python (read at import, so Spark's Python workers forked from an
agent inherit it) or the `kpl_decoder` setting (the agents apply it, and the Spark source passes it to every
executor with its partitions).

Invariant: choosing imports only the protobuf runtime's implementation check (about 1.4 MB); the decoder module
itself (agent/kpl_protobuf.py with descriptor_pb2 and the message classes, about 7 MB resident) is imported when the
first aggregate is decoded, so a process that never sees one (most MultiLang applications) does not carry it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from shardherd.agent import kpl_python
from shardherd.agent.kpl import KPL_DECODERS, UserRecord

DECODER_ENV = "SHARDHERD_KPL_DECODER"

Decoder = Callable[[bytes], list[UserRecord]]
ColumnDecoder = Callable[[bytes], tuple[list[str], list[bytes]]]

_decode: Decoder = kpl_python.decode
_decode_columns: ColumnDecoder = kpl_python.decode_columns
_name = "python"
_choice: str | None = None


def decode_aggregate(data: bytes) -> list[UserRecord]:
    """The user records packed in an aggregate, in order; BrokenAggregate if anything about it is wrong."""
    return _decode(data)


def decode_columns(data: bytes) -> tuple[list[str], list[bytes]]:
    """The partition keys and payloads of an aggregate's user records, in order; BrokenAggregate as above."""
    return _decode_columns(data)


def decoder_name() -> str:
    """The decoder in use: "protobuf-upb" or "python"."""
    return _name


def use(choice: str) -> str:
    """Choose the decoder (`auto` or `python`); a no-op when that choice is already made. Returns its name."""
    global _decode, _decode_columns, _name, _choice
    if choice not in KPL_DECODERS:
        raise ValueError(f"{DECODER_ENV} must be one of {list(KPL_DECODERS)}, got {choice!r}")
    if choice == _choice:
        return _name
    fast = _protobuf_decoders() if choice == "auto" else None
    _decode, _decode_columns, _name = ((*fast, "protobuf-upb") if fast is not None
                                       else (kpl_python.decode, kpl_python.decode_columns, "python"))
    _choice = choice
    return _name


def _protobuf_decoders() -> tuple[Decoder, ColumnDecoder] | None:
    """The protobuf runtime's decoders if `protobuf` is installed with its C (upb) implementation (loaded on use)."""
    try:
        from google.protobuf.internal import api_implementation
    except ImportError:
        return None
    return (_protobuf_decode, _protobuf_decode_columns) if api_implementation.Type() == "upb" else None


def _protobuf_decode(data: bytes) -> list[UserRecord]:
    from shardherd.agent import kpl_protobuf  # on the first aggregate (module docstring)

    return kpl_protobuf.decode(data)


def _protobuf_decode_columns(data: bytes) -> tuple[list[str], list[bytes]]:
    from shardherd.agent import kpl_protobuf  # on the first aggregate (module docstring)

    return kpl_protobuf.decode_columns(data)


use(os.environ.get(DECODER_ENV, "auto").strip().lower() or "auto")
