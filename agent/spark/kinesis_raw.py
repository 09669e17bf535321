"""A Kinesis client for the hot path that skips botocore's response parsing: signed JSON in, plain dicts out.

botocore turns every GetRecords record into Python objects one by one (a datetime per arrival timestamp, base64
decoding per payload): about 7 of the 10 microseconds a record costs a boto3 consumer. The Spark source needs none
of that per record: it hands whole columns to Arrow. This client signs the request with botocore (SigV4, the usual
credential chain) and returns the response body as `json.loads` gives it: `Data` still base64 text,
`ApproximateArrivalTimestamp` epoch seconds. Throttling and transient failures are retried with jittered backoff;
given a `ReaderStats`, a call counts into it what a plain agent's reader counts (GetRecords answered, iterators
answered, throttled attempts), so a shard's /metrics read the same on both kinds of agent.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import boto3
import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from shardherd.agent.reader import ReaderStats, ShardNotFound, ShardReadError, require_records
from shardherd.shared.aws import make_client

_TARGET = "Kinesis_20131202."
_CONTENT_TYPE = "application/x-amz-json-1.1"
# Connections kept open per endpoint. A task reads its shards at once, one thread each (arrow_read.read_plans), and the
# driver probes from 8 threads: with fewer, each call beyond the pool would open (on AWS: TLS-handshake) a new one.
KEPT_CONNECTIONS = 64
_THROTTLED = "ProvisionedThroughputExceededException"
_LIMITS = frozenset({_THROTTLED, "LimitExceededException", "KMSThrottlingException", "ThrottlingException"})
_RETRYABLE = _LIMITS | {"InternalFailure", "ServiceUnavailable"}


class IteratorExpired(ShardReadError):
    """GetRecords said the shard iterator expired; get a new one from the last position."""


class Throttled(ShardReadError):
    """The shard's (or the account's) read limits refused the call through every attempt."""


class RawKinesis:
    """GetShardIterator and GetRecords as signed JSON calls; responses are `json.loads` dicts (no botocore parse).

    `timeouts` (connect, read seconds) replace 5 and 30 for a caller with a deadline (a driver's probes,
    agent/read_deadline.py).
    """

    def __init__(self, region: str, endpoint_url: str | None = None, attempts: int = 8,
                 rng: random.Random | None = None, timeouts: tuple[float, float] = (5.0, 30.0)) -> None:
        self._endpoint = str(make_client("kinesis", region, endpoint_url).meta.endpoint_url)
        self._region = region
        credentials = boto3.session.Session().get_credentials()
        if credentials is None and endpoint_url:
            credentials = Credentials("local", "local")  # an emulator, as make_client does
        if credentials is None:
            raise ShardReadError("no AWS credentials found for Kinesis")
        self._credentials = credentials
        self._http = urllib3.PoolManager(maxsize=KEPT_CONNECTIONS, retries=False,
                                         timeout=urllib3.Timeout(connect=timeouts[0], read=timeouts[1]))
        self._attempts = attempts
        self._rng = rng or random.Random()

    def get_shard_iterator(self, stream: str, shard_id: str, arguments: dict[str, Any],
                           stats: ReaderStats | None = None) -> str:
        """A shard iterator (`arguments`: ShardIteratorType and its sequence number or timestamp)."""
        response = self.call("GetShardIterator", {"StreamName": stream, "ShardId": shard_id, **arguments}, stats)
        if stats is not None:
            stats.iterators_requested += 1
        return str(response["ShardIterator"])

    def get_records(self, iterator: str, limit: int, stats: ReaderStats | None = None) -> dict[str, Any]:
        """One GetRecords response as plain JSON: Records (Data base64 text, timestamps epoch s), NextShardIterator."""
        response = self.call("GetRecords", {"ShardIterator": iterator, "Limit": limit}, stats)
        if stats is not None:
            stats.get_records_calls += 1
        require_records(response, iterator[:16] + "...")
        return response

    def call(self, operation: str, body: dict[str, Any], stats: ReaderStats | None = None) -> dict[str, Any]:
        """One Kinesis JSON call with retries of throttling and transient failures; typed errors otherwise.

        Each throttled attempt counts in `stats.throttled`.
        """
        payload = json.dumps(body).encode()
        delay = 0.05
        for attempt in range(1, self._attempts + 1):
            try:
                status, data = self._send(operation, payload)
            except urllib3.exceptions.HTTPError as exc:
                if attempt == self._attempts:
                    raise ShardReadError(f"{operation} failed: {exc}") from exc
            else:
                if status == 200:
                    result = _json_object(data)
                    if result is not None:
                        return result
                    if attempt == self._attempts:  # a 200 that is not Kinesis' answer (a proxy's page): retried
                        raise ShardReadError(f"{operation} answered 200 without a JSON object: {data[:80]!r}")
                else:
                    _refused(operation, status, data, stats, attempt == self._attempts)
            time.sleep(self._rng.uniform(0, delay))
            delay = min(delay * 2, 2.0)
        raise ShardReadError(f"{operation} failed after {self._attempts} attempts")  # pragma: no cover

    def _send(self, operation: str, payload: bytes) -> tuple[int, bytes]:
        request = AWSRequest(method="POST", url=self._endpoint, data=payload,
                             headers={"X-Amz-Target": _TARGET + operation, "Content-Type": _CONTENT_TYPE})
        credentials = self._credentials.get_frozen_credentials()
        SigV4Auth(credentials, "kinesis", self._region).add_auth(request)
        response = self._http.request("POST", self._endpoint, body=payload, headers=dict(request.headers.items()))
        return response.status, response.data


def _refused(operation: str, status: int, data: bytes, stats: ReaderStats | None, last: bool) -> None:
    """An error answer: raise its typed error, unless it is retryable and this was not the `last` attempt."""
    code, message = _error(data)
    if code == "ExpiredIteratorException":
        raise IteratorExpired(message)
    if code == "ResourceNotFoundException":
        raise ShardNotFound(f"{operation}: {message}")
    if code == _THROTTLED and stats is not None:
        stats.throttled += 1
    if not (code in _RETRYABLE or status >= 500) or last:
        error = Throttled if code in _LIMITS else ShardReadError
        # The refusal in botocore's shape as the cause: agent/reader.py's own_fault tells this worker's credentials
        refusal = ClientError({"Error": {"Code": code, "Message": message}}, operation)  # from a shared fault.
        raise error(f"{operation} failed: HTTP {status} {code}: {message}") from refusal


def _json_object(data: bytes) -> dict[str, Any] | None:
    """A 200's body as Kinesis sends it (a JSON object; empty is {}), None where it is not one."""
    try:
        value = json.loads(data) if data else {}
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _error(data: bytes) -> tuple[str, str]:
    try:
        value = json.loads(data)
    except ValueError:
        return "Unknown", data[:200].decode(errors="replace")
    code = str(value.get("__type", "Unknown")).rsplit("#", 1)[-1]
    return code, str(value.get("message") or value.get("Message") or "")
