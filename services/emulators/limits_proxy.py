"""An AWS-faithful Kinesis on 127.0.0.1: an asyncio HTTP proxy that enforces per-shard limits in front of kinesalite.

kinesalite enforces none of Kinesis's per-shard limits. This proxy admits or throttles each call by the shard it
touches (services/emulators/throttle_model.py holds the model, docs/decisions/0029-kinesis-limits-model.md its
sources), answers throttled calls as AWS does, and serves its counts as JSON on `GET /limits`.

Invariants:
- A throttled call never reaches the emulator: GetRecords, GetShardIterator and PutRecord get HTTP 400
  `ProvisionedThroughputExceededException` with AWS's message; PutRecords forwards only the admitted records and
  reports each throttled one in place (ErrorCode, ErrorMessage) with FailedRecordCount.
- GetRecords is mapped to its shard through the iterators this proxy handed out (from GetShardIterator and from
  each NextShardIterator), kept 5 minutes as AWS keeps them valid; an iterator it never saw is forwarded uncounted
  against any shard (counted as `unknown/unknown-iterator`).
- Writes are mapped to shards by MD5 of the partition key (or ExplicitHashKey) over the open shards' hash ranges,
  from ListShards on the emulator, refreshed after 1 s or when the emulator placed a record elsewhere.
- A GetRecords answer is cut to 10 MiB of data (a new iterator from the last record kept); a cut or full page
  reports MillisBehindLatest as the age of its last record (kinesalite always says 0).
- Calls the proxy does not model (CreateStream, ListShards, CBOR bodies...) pass through unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import uuid
from collections import OrderedDict
from typing import Any

from shardherd.services.emulators.hash_routing import NoShardForKey, ShardMap, hash_key
from shardherd.services.emulators.http_wire import Message, Upstream, read_message, response_bytes
from shardherd.services.emulators.ports import LOOPBACK
from shardherd.services.emulators.throttle_model import ShardKey, ShardLimits, ThrottleModel
from shardherd.shared.clock import Clock, SystemClock

ACCOUNT = "000000000000"  # kinesalite's account id
THROTTLED = "ProvisionedThroughputExceededException"
ITERATOR_LIFETIME = 300.0  # seconds an AWS shard iterator stays valid
SHARD_MAP_AGE = 1.0
UNKNOWN = ShardKey("unknown", "unknown-iterator")
_JSON = "application/x-amz-json-1.1"


def caller_of(headers: dict[str, str]) -> str:
    """Who made the call: the SigV4 access key id, else the user agent's first word."""
    auth = headers.get("authorization", "")
    if "Credential=" in auth:
        return auth.split("Credential=", 1)[1].split("/", 1)[0]
    return headers.get("user-agent", "anonymous").split(" ", 1)[0] or "anonymous"


def data_size(data: str) -> int:
    """Bytes of a base64 `Data` field once decoded."""
    return len(data) // 4 * 3 - (len(data) - len(data.rstrip("=")))


def stream_of(payload: dict[str, Any]) -> str:
    """The stream a request names (StreamName, or the tail of StreamARN)."""
    return str(payload.get("StreamName") or str(payload.get("StreamARN", "")).rsplit("/", 1)[-1])


def _error(code: str, message: str, status: int = 400) -> Message:
    body = json.dumps({"__type": code, "message": message}).encode()
    headers = {"content-type": _JSON, "x-amzn-requestid": str(uuid.uuid4()), "x-amzn-errortype": code}
    return Message("", headers, body, status)


def _json_answer(answer: dict[str, Any], like: Message) -> Message:
    return Message("", like.headers, json.dumps(answer).encode(), 200)


class LimitsProxy:
    """The proxy's request handling over one upstream emulator; `serve` runs it on a loopback port."""

    def __init__(self, upstream_port: int, clock: Clock | None = None, limits: ShardLimits | None = None) -> None:
        self.clock = clock or SystemClock()
        self.model = ThrottleModel(self.clock, limits or ShardLimits())
        self.upstream = Upstream(upstream_port)
        self._iterators: OrderedDict[str, tuple[ShardKey, float]] = OrderedDict()
        self._maps: dict[str, tuple[ShardMap, float]] = {}

    async def serve(self, port: int) -> asyncio.Server:
        """Listen on 127.0.0.1:`port`."""
        return await asyncio.start_server(self._connection, LOOPBACK, port)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (request := await read_message(reader)) is not None:
                try:
                    answer = await self.handle(request)
                except (OSError, asyncio.IncompleteReadError) as exc:
                    answer = _error("InternalFailure", f"limits proxy: the emulator did not answer: {exc}", 502)
                writer.write(response_bytes(answer.status, answer.headers, answer.body))
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass  # the client went away mid-message
        finally:
            writer.close()

    async def handle(self, request: Message) -> Message:
        """Answer one request: the counts on GET /limits, else a Kinesis call, limited where modelled."""
        if request.method == "GET":
            if request.path.startswith("/limits"):
                return Message("", {"content-type": "application/json"},
                               json.dumps(self.model.snapshot()).encode(), 200)
            return Message("", {"content-type": "text/plain"}, b"shardherd kinesis limits proxy\n", 200)
        operation = request.headers.get("x-amz-target", "").rsplit(".", 1)[-1]
        handler = self._handlers.get(operation)
        if handler is None or "json" not in request.headers.get("content-type", ""):
            return await self.upstream.post(request.headers, request.body)
        return await handler(self, request, json.loads(request.body or b"{}"), caller_of(request.headers))

    # ------------------------------------------------------------------ reads
    async def _get_shard_iterator(self, request: Message, payload: dict[str, Any], caller: str) -> Message:
        key = ShardKey(stream_of(payload), str(payload.get("ShardId", "")))
        if not self.model.admit_iterator(key, caller):
            return _error(THROTTLED, f"Rate exceeded for shard {key.shard} in stream {key.stream} "
                                     f"under account {ACCOUNT}.")
        answer = await self.upstream.post(request.headers, request.body)
        if answer.status == 200:
            self._remember(json.loads(answer.body).get("ShardIterator"), key)
        return answer

    async def _get_records(self, request: Message, payload: dict[str, Any], caller: str) -> Message:
        key = self._shard_of_iterator(str(payload.get("ShardIterator", "")))
        if key is None:
            self.model.count(UNKNOWN, caller, "GetRecords.Unmapped")
            return await self.upstream.post(request.headers, request.body)
        if not self.model.admit_read(key, caller):
            return _error(THROTTLED, f"Rate exceeded for Shard - {ACCOUNT}/{key.stream}/{key.shard}")
        answer = await self.upstream.post(request.headers, request.body)
        if answer.status != 200:
            return answer
        result = json.loads(answer.body)
        records: list[dict[str, Any]] = result.get("Records", [])
        kept, served = self._within_response_limit(records)
        changed = kept < len(records)
        if changed:
            result["Records"] = records = records[:kept]
            result["NextShardIterator"] = await self._iterator_after(request, key, records[-1]["SequenceNumber"])
        if records and (changed or len(records) >= int(payload.get("Limit", self.model.limits.max_response_records))):
            arrival = float(records[-1].get("ApproximateArrivalTimestamp", self.clock.time()))
            result["MillisBehindLatest"] = max(1, round((self.clock.time() - arrival) * 1000))
            changed = True
        self._remember(result.get("NextShardIterator"), key)
        self.model.served(key, caller, len(records), served)
        return _json_answer(result, answer) if changed else answer

    def _within_response_limit(self, records: list[dict[str, Any]]) -> tuple[int, int]:
        """How many leading records fit in one answer's 10 MiB, and their data bytes."""
        total, cap = 0, self.model.limits.max_response_bytes
        for index, record in enumerate(records):
            size = data_size(str(record.get("Data", "")))
            if total + size > cap and index > 0:
                return index, total
            total += size
        return len(records), total

    async def _iterator_after(self, request: Message, key: ShardKey, sequence: str) -> str | None:
        """A fresh iterator just after `sequence` (the proxy's own call: it counts against no limit)."""
        body = json.dumps({"StreamName": key.stream, "ShardId": key.shard,
                           "ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": sequence})
        headers = {**request.headers, "x-amz-target": "Kinesis_20131202.GetShardIterator"}
        answer = await self.upstream.post(headers, body.encode())
        iterator = json.loads(answer.body).get("ShardIterator") if answer.status == 200 else None
        return str(iterator) if iterator else None

    def _remember(self, iterator: object, key: ShardKey) -> None:
        if not isinstance(iterator, str):
            return
        now = self.clock.monotonic()
        self._iterators[iterator] = (key, now)
        self._iterators.move_to_end(iterator)
        while self._iterators:
            oldest, (_, issued) = next(iter(self._iterators.items()))
            if now - issued <= ITERATOR_LIFETIME:
                break
            del self._iterators[oldest]

    def _shard_of_iterator(self, iterator: str) -> ShardKey | None:
        found = self._iterators.get(iterator)
        return found[0] if found is not None else None

    # ------------------------------------------------------------------ writes
    async def _shard_map(self, request: Message, stream: str, refresh: bool = False) -> ShardMap | None:
        """The stream's open shards (None if the emulator will not list them: it then answers the call itself)."""
        cached = self._maps.get(stream)
        if cached is not None and not refresh and self.clock.monotonic() - cached[1] < SHARD_MAP_AGE:
            return cached[0]
        shards: list[dict[str, Any]] = []
        ask: dict[str, Any] = {"StreamName": stream}
        headers = {**request.headers, "x-amz-target": "Kinesis_20131202.ListShards"}
        while True:
            answer = await self.upstream.post(headers, json.dumps(ask).encode())
            if answer.status != 200:
                return None
            page = json.loads(answer.body)
            shards += page.get("Shards", [])
            if not page.get("NextToken"):
                break
            ask = {"NextToken": page["NextToken"]}
        shard_map = ShardMap.from_list_shards(shards)
        self._maps[stream] = (shard_map, self.clock.monotonic())
        return shard_map

    async def _shard_for(self, request: Message, stream: str, entry: dict[str, Any]) -> str | None:
        """The shard a record goes to (None if unknown: the emulator then decides and reports the error)."""
        key = hash_key(str(entry.get("PartitionKey", "")), entry.get("ExplicitHashKey"))
        for refresh in (False, True):
            shard_map = await self._shard_map(request, stream, refresh)
            if shard_map is None:
                return None
            try:
                return shard_map.shard_for(key)
            except NoShardForKey:
                continue
        return None

    @staticmethod
    def _record_size(entry: dict[str, Any]) -> int:
        return data_size(str(entry.get("Data", ""))) + len(str(entry.get("PartitionKey", "")).encode())

    def _write_refused(self, key: ShardKey) -> dict[str, str]:
        return {"ErrorCode": THROTTLED,
                "ErrorMessage": f"Rate exceeded for shard {key.shard} in stream {key.stream} under account {ACCOUNT}."}

    async def _put_record(self, request: Message, payload: dict[str, Any], caller: str) -> Message:
        stream = stream_of(payload)
        shard = await self._shard_for(request, stream, payload)
        if shard is not None:
            key = ShardKey(stream, shard)
            if not self.model.admit_write(key, caller, self._record_size(payload)):
                return _error(THROTTLED, self._write_refused(key)["ErrorMessage"])
        answer = await self.upstream.post(request.headers, request.body)
        self._check_placement(stream, shard, answer)
        return answer

    def _check_placement(self, stream: str, predicted: str | None, answer: Message) -> None:
        """Forget the stream's shard map if the emulator put a record on another shard than predicted."""
        if answer.status == 200 and predicted is not None and json.loads(answer.body).get("ShardId") != predicted:
            self._maps.pop(stream, None)

    async def _put_records(self, request: Message, payload: dict[str, Any], caller: str) -> Message:
        stream, entries = stream_of(payload), payload.get("Records")
        if not isinstance(entries, list) or not 1 <= len(entries) <= 500:
            return await self.upstream.post(request.headers, request.body)  # the emulator's validation error
        admitted, results = await self._admit_records(request, stream, entries, caller)
        answer: Message | None = None
        if admitted:
            body = json.dumps({**payload, "Records": [entries[index] for index in admitted]}).encode()
            answer = await self.upstream.post(request.headers, body)
            if answer.status != 200:
                return answer
            for index, result in zip(admitted, json.loads(answer.body)["Records"], strict=True):
                results[index] = result
        final = [result or {} for result in results]
        merged = {"FailedRecordCount": sum(1 for result in final if "ErrorCode" in result), "Records": final}
        return _json_answer(merged, answer or Message("", {"content-type": _JSON}, b"", 200))

    async def _admit_records(self, request: Message, stream: str, entries: list[dict[str, Any]],
                             caller: str) -> tuple[list[int], list[dict[str, Any] | None]]:
        """The indexes of the records admitted, and each refused record's result entry in its place."""
        results: list[dict[str, Any] | None] = [None] * len(entries)
        admitted: list[int] = []
        for index, entry in enumerate(entries):
            shard = await self._shard_for(request, stream, entry)
            key = ShardKey(stream, shard or "")
            if shard is None or self.model.admit_write(key, caller, self._record_size(entry)):
                admitted.append(index)
            else:
                results[index] = self._write_refused(key)
        return admitted, results

    _handlers = {
        "GetShardIterator": _get_shard_iterator,
        "GetRecords": _get_records,
        "PutRecord": _put_record,
        "PutRecords": _put_records,
    }


async def _run(upstream_port: int, port: int, limits: ShardLimits) -> None:
    proxy = LimitsProxy(upstream_port, limits=limits)
    server = await proxy.serve(port)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def watch_stdin() -> None:  # the parent closing our stdin (or dying) ends the proxy: no orphans
        sys.stdin.read()
        loop.call_soon_threadsafe(done.set)

    threading.Thread(target=watch_stdin, name="stdin-watch", daemon=True).start()
    async with server:
        await done.wait()
    proxy.upstream.close()


def main(argv: list[str] | None = None) -> None:
    """`python -m shardherd.services.emulators.limits_proxy --target-port N --port M`: serve until stdin closes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--target-port", type=int, required=True, help="the emulator's port on 127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="the port to listen on (127.0.0.1)")
    parser.add_argument("--limits", default="{}",
                        help="JSON object overriding ShardLimits fields (tests shrink them), e.g. "
                             '\'{"max_response_bytes": 4096}\'')
    args = parser.parse_args(argv)
    asyncio.run(_run(args.target_port, args.port, ShardLimits(**json.loads(args.limits))))


if __name__ == "__main__":
    main()
