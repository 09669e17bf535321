"""The Node Kinesis emulators survive a client that dies in the middle of sending a request.

kinesalite rethrows a request's 'error' event; before the launcher's prelude caught it, one agent or executor killed
mid-call (`scenario kill-agent`, the chaos and driver-kill tests) ended the emulator, and with it every shard's
reads, with "Error: aborted" (ECONNRESET). kinesis-local closed its listener (and ran on, refusing every connection)
when a connection was reset before it was accepted: twice in CI, where the loaded server accepted late, and every time
here for a connect followed at once by a reset.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from shardherd.services.emulators.kinesalite import Kinesalite, KinesisLocal, NodeEmulator
from shardherd.services.emulators.ports import wait_until

pytestmark = pytest.mark.slow

# A request whose headers promise more body than is ever sent: the server is still reading it when the reset comes.
_HALF_REQUEST = (b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-amz-json-1.1\r\n"
                 b"X-Amz-Target: Kinesis_20131202.ListStreams\r\nContent-Length: 1000\r\n\r\n{\"Limit\": 1")


def _reset(port: int, request: bytes, wait: float) -> None:
    """Send `request`, wait, then drop the connection with a TCP reset (what a killed client's kernel does)."""
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(request)
        time.sleep(wait)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.mark.parametrize("emulator_type", [Kinesalite, KinesisLocal])
def test_an_emulator_serves_on_after_a_client_resets_mid_request(emulator_type: type[NodeEmulator]) -> None:
    with emulator_type() as emulator:
        kinesis = boto3.client("kinesis", endpoint_url=emulator.endpoint_url, region_name="us-east-1",
                               aws_access_key_id="test", aws_secret_access_key="test",
                               config=Config(connect_timeout=2, read_timeout=3, retries={"max_attempts": 1}))
        kinesis.create_stream(StreamName="resets", ShardCount=1)
        for _ in range(3):
            _reset(emulator.port, _HALF_REQUEST, 0.2)  # the server has the headers and waits for the body
            _reset(emulator.port, b"", 0.0)  # reset before the server accepted the connection
        time.sleep(0.5)  # an emulator that throws on the reset has exited by now
        assert emulator.running, emulator.output()
        # Serving on, not just running: a closed listener shows as refused connections (the failure says so).
        seen: list[str] = []
        try:
            wait_until(lambda: _lists(kinesis, "resets", seen), 20, "the emulator answering after the resets",
                       lambda: emulator.running)
        except RuntimeError as error:
            raise AssertionError(f"{error}; last answers {seen[-3:]}; emulator said: {emulator.output()}") from error


def _lists(kinesis: Any, stream: str, seen: list[str]) -> bool:
    """Whether ListStreams names `stream`; what it answered instead goes to `seen` (the failure message shows it)."""
    try:
        names = kinesis.list_streams()["StreamNames"]
    except (EndpointConnectionError, ReadTimeoutError) as error:
        seen.append(f"{type(error).__name__}: {error}")
        return False
    seen.append(f"streams {names}")
    return stream in names
