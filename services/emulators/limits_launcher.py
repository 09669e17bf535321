"""Starts the Kinesis limits proxy (services/emulators/limits_proxy.py) as a child process on 127.0.0.1.

Invariants: the child listens on loopback only, in its own process group, ends by itself when its parent's pipe
closes (no orphan if the parent dies) and is stopped by killing its group; `counts()` reads its `GET /limits`.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from shardherd.services.emulators.kinesalite import end_process_group
from shardherd.services.emulators.ports import LOOPBACK, free_port, wait_until
from shardherd.services.emulators.throttle_model import ShardLimits


class KinesisLimits:
    """The limits proxy in front of the Kinesis emulator on `target_port`; a context manager, or start()/stop().

    In a test: `with KinesisLimits(kinesalite.port) as limits:` then give boto3 `limits.endpoint_url`, and read
    `limits.counts()` (per shard, per caller, per pair) to assert on calls, bytes and throttles.
    """

    def __init__(self, target_port: int, port: int | None = None, log_path: Path | None = None,
                 startup_timeout: float = 30.0, limits: ShardLimits | None = None) -> None:
        self.target_port = target_port
        self.limits = limits or ShardLimits()
        self.port = port or free_port()
        self.log_path = log_path
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        """The Kinesis endpoint to give boto3 clients."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The proxy's process id while started."""
        return self._process.pid if self._process is not None else None

    @property
    def exit_code(self) -> int | None:
        """The process's exit status once it ended by itself; None while it runs or after stop()."""
        return self._process.poll() if self._process is not None else None

    @property
    def running(self) -> bool:
        """True while the proxy process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> Self:
        """Start the proxy and wait until it answers `GET /limits`."""
        self._log = tempfile.TemporaryFile() if self.log_path is None else open(self.log_path, "w+b")  # noqa: SIM115
        self._process = subprocess.Popen(
            [sys.executable, "-m", "shardherd.services.emulators.limits_proxy",
             "--target-port", str(self.target_port), "--port", str(self.port),
             "--limits", json.dumps(dataclasses.asdict(self.limits))],
            stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT, env=dict(os.environ),
            start_new_session=True)
        try:
            wait_until(self._answers, self._startup_timeout, f"kinesis limits proxy on port {self.port}",
                       lambda: self.running)
        except RuntimeError:
            self.stop()
            raise
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

    def stop(self) -> None:
        """Stop the proxy (idempotent)."""
        process, self._process = self._process, None
        if process is not None:
            end_process_group(process)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
