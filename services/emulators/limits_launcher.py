"""Starts the Kinesis limits proxy (services/emulators/limits_proxy.py) as a child process on 127.0.0.1.

Invariants: the child listens on loopback only, in its own process group, ends by itself when its parent's pipe
closes (no orphan if the parent dies) and is stopped by killing its group; `counts()` reads its `GET /limits`.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import sys
from pathlib import Path
from typing import Any, Self

from shardherd.services.emulators.kinesalite import LoopbackServer
from shardherd.services.emulators.ports import LOOPBACK
from shardherd.services.emulators.throttle_model import ShardLimits


class KinesisLimits(LoopbackServer):
    """The limits proxy in front of the Kinesis emulator on `target_port`; a context manager, or start()/stop().

    In a test: `with KinesisLimits(kinesalite.port) as limits:` then give boto3 `limits.endpoint_url`, and read
    `limits.counts()` (per shard, per caller, per pair) to assert on calls, bytes and throttles.
    """

    def __init__(self, target_port: int, port: int | None = None, log_path: Path | None = None,
                 startup_timeout: float = 30.0, limits: ShardLimits | None = None) -> None:
        super().__init__(port, startup_timeout, log_path)
        self.target_port = target_port
        self.limits = limits or ShardLimits()

    def start(self) -> Self:
        """Start the proxy and wait until it answers `GET /limits`."""
        self._launch([sys.executable, "-m", "shardherd.services.emulators.limits_proxy",
                      "--target-port", str(self.target_port), "--port", str(self.port),
                      "--limits", json.dumps(dataclasses.asdict(self.limits))], "kinesis limits proxy")
        return self

    def _answers(self) -> bool:
        try:
            self.counts()
        except (OSError, ValueError):
            return False
        return True

    def counts(self) -> dict[str, Any]:
        """The proxy's counts: `shards`, `callers` and `by_shard_and_caller`, each metric by CloudWatch's name."""
        connection = http.client.HTTPConnection(LOOPBACK, self.port, timeout=5.0)
        try:
            connection.request("GET", "/limits")
            answer: dict[str, Any] = json.loads(connection.getresponse().read())
            return answer
        finally:
            connection.close()
