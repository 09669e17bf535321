"""Which KPL aggregate decoder this process uses: the protobuf runtime's C one, else pure Python.

`auto` (the default) takes agent/kpl_protobuf.py when `protobuf` is importable and its implementation is upb (C);
any other runtime (the pure-Python protobuf, the old C++ one, or none) falls back to agent/kpl_python.py. `python`
forces the fallback: set SHARDHERD_KPL_DECODER=python (read on first use, so Spark's Python workers forked from an
agent inherit it) or the `kpl_decoder` setting (the agents apply it, and the Spark source passes it to every
executor with its partitions).

An agent's `auto` waits (`use(..., after=PAYBACK_RECORDS)`): it decodes with the pure-Python decoder until the
process has decoded that many user records, then looks for the C one. Loading the C decoder (the protobuf runtime's
modules, the message classes) costs a plain agent about 3 MiB of its resident memory for as long as it runs, and
about 25 ms of CPU; it saves about 3 microseconds per user record (`bench/kpl_decode.py`). Waiting for 100,000
records bounds what the pure-Python decoder costs a process more, over its whole life, to about 0.3-0.5 CPU
seconds, and keeps the 3 MiB out of every agent that decodes fewer: one holding 8 shards at a few aggregated
records a second (the scale run's) switches after hours, one reading 10,000 a second after 10 s (decision 0024).
Spark executors (`read_partition`) and any caller of `use` without `after` choose at once, as before.

Invariants: nothing of `protobuf` is imported until the choice is resolved (the first decode, `decoder_name`, or
`use` without `after`); both decoders give the same answer for every input (tests/agent/test_kpl_decoders.py), so
the switch, which reader threads may make at once, changes no record; the decoder module itself
(agent/kpl_protobuf.py) is imported by the first aggregate decoded after the choice, not by choosing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from shardherd.agent import kpl_python
from shardherd.agent.kpl import KPL_DECODERS, UserRecord

log = logging.getLogger(__name__)

DECODER_ENV = "SHARDHERD_KPL_DECODER"
# User records an agent decodes in pure Python before `auto` loads the C decoder (see the module's docstring).
PAYBACK_RECORDS = 100_000

Decoder = Callable[[bytes], list[UserRecord]]
ColumnDecoder = Callable[[bytes], tuple[list[str], list[bytes]]]

_decode: Decoder = kpl_python.decode
_decode_columns: ColumnDecoder = kpl_python.decode_columns
_name = "python"
_choice: str | None = None  # None: the environment's choice, not made yet
_waiting = False  # `auto` decoding in Python until `_after` user records
_after = 0
_decoded = 0


def decode_aggregate(data: bytes) -> list[UserRecord]:
    """The user records packed in an aggregate, in order; BrokenAggregate if anything about it is wrong."""
    _choose_once()
    records = _decode(data)
    if _waiting:
        _count(len(records))
    return records


def decode_columns(data: bytes) -> tuple[list[str], list[bytes]]:
    """The partition keys and payloads of an aggregate's user records, in order; BrokenAggregate as above."""
    _choose_once()
    columns = _decode_columns(data)
    if _waiting:
        _count(len(columns[0]))
    return columns


def decoder_name() -> str:
    """The decoder in use now: "protobuf-upb" or "python" (an agent's `auto` is "python" until it switches)."""
    _choose_once()
    return _name


def use(choice: str, after: int = 0) -> str:
    """Choose the decoder (`auto` or `python`); a no-op when that choice is already made. Returns its name now.

    With `after`, `auto` decodes that many user records in pure Python before it looks for the C decoder.
    """
    global _choice, _waiting, _after, _decoded
    if choice not in KPL_DECODERS:
        raise ValueError(f"{DECODER_ENV} must be one of {list(KPL_DECODERS)}, got {choice!r}")
    if (choice, after) == (_choice, _after):
        return _name
    _choice, _after, _decoded = choice, after, 0
    _waiting = choice == "auto" and after > 0
    if _waiting:
        _set(None)
    else:
        _set(_protobuf_decoders() if choice == "auto" else None)
    return _name


def _choose_once() -> None:
    """The environment's choice, on first use when nobody called `use` before (module docstring)."""
    if _choice is None:
        use(os.environ.get(DECODER_ENV, "auto").strip().lower() or "auto")


def _count(records: int) -> None:
    """Count user records decoded while `auto` waits; past `_after`, take the C decoder if there is one."""
    global _decoded, _waiting
    _decoded += records
    if _waiting and _decoded >= _after:
        _waiting = False
        _set(_protobuf_decoders())
        log.info("KPL: %d user records decoded in Python; the %s decoder from now on", _decoded, _name)


def _set(fast: tuple[Decoder, ColumnDecoder] | None) -> None:
    global _decode, _decode_columns, _name
    _decode, _decode_columns, _name = ((*fast, "protobuf-upb") if fast is not None
                                       else (kpl_python.decode, kpl_python.decode_columns, "python"))


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
