"""botocore's JSON response parser with a direct path for lists of Kinesis records (GetRecords' `Records`).

botocore turns a response into Python values by walking the service model: for every field of every record a
method lookup, a shape lookup and a call. For GetRecords that walk was the largest CPU cost of a MultiLang agent
draining a backlog (about 38% of its GIL time by py-spy; decision 0024). This parser builds each record's dict from
a plan made once per list (botocore makes a parser per response): each member's name, its key on the wire and its
converter (the blob and timestamp parsers the client was given, strings as they are, anything else through
botocore's own walk).

Invariant: the parsed records are what botocore's walk returns (the same keys: modeled members present and not
null; the same values and types); every other shape, and every error response, is parsed by botocore unchanged.
tests/test_kinesis_parser.py compares the two on the same bodies.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable
from typing import Any

from botocore.model import Shape, StructureShape
from botocore.parsers import JSONParser, ResponseParserFactory

RECORD_LIST = "RecordList"  # the Kinesis model's name for GetRecords' (and SubscribeToShard's) list of records

Plan = tuple[tuple[str, str, Callable[[Any], Any]], ...]


def decode_blob(value: str | bytes) -> bytes:
    """Base64 text to bytes as botocore's default blob parser (base64.b64decode, not strict), without its wrapper."""
    return binascii.a2b_base64(value)


class KinesisParser(JSONParser):
    """The JSON parser for a Kinesis client: lists of records take the direct path, everything else botocore's."""

    # botocore's, not in its type stubs
    _blob_parser: Callable[[Any], Any]
    _timestamp_parser: Callable[[Any], Any]
    _parse_shape: Callable[[Shape, Any], Any]

    def _handle_list(self, shape: Shape, node: Any) -> Any:
        member = getattr(shape, "member", None)
        if shape.name != RECORD_LIST or member is None or member.type_name != "structure" or not isinstance(
                node, list):
            return super()._handle_list(shape, node)  # type: ignore[misc]  # botocore's, not in its stubs
        plan = self._plan(member)
        return [None if item is None else {name: convert(item[key]) for name, key, convert in plan
                                           if item.get(key) is not None} for item in node]

    def _plan(self, shape: StructureShape) -> Plan:
        return tuple((name, member.serialization.get("name", name), self._converter(member))
                     for name, member in shape.members.items())

    def _converter(self, member: Shape) -> Callable[[Any], Any]:
        kind = member.type_name
        if kind == "string":
            return _same
        if kind == "blob":
            return self._blob_parser
        if kind == "timestamp":
            return self._timestamp_parser
        return lambda value: self._parse_shape(member, value)


def _same(value: Any) -> Any:
    return value


class KinesisParserFactory(ResponseParserFactory):
    """Creates KinesisParser for the JSON protocol (Kinesis' own), botocore's parsers for any other.

    Blobs are decoded by `decode_blob` unless set otherwise.
    """

    _defaults: dict[str, Any]  # botocore's, not in its type stubs

    def __init__(self) -> None:
        super().__init__()
        self.set_parser_defaults(blob_parser=decode_blob)

    def create_parser(self, protocol_name: str) -> Any:
        """A parser for `protocol_name`, with the defaults set on this factory."""
        if protocol_name == "json":
            return KinesisParser(**self._defaults)
        return super().create_parser(protocol_name)
