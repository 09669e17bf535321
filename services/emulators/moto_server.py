"""Runs moto's server (the DynamoDB emulator) as a child process on 127.0.0.1 and stops it without orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import TracebackType

from shardherd.services.emulators.ports import LOOPBACK, free_port, port_open, wait_until


class MotoServer:
    """A moto server process on a free loopback port; use as a context manager or call start()/stop()."""

    def __init__(self, port: int | None = None, startup_timeout: float = 30.0) -> None:
        self.port = port or free_port()
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        """The HTTP endpoint to give boto3 clients."""
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> MotoServer:
        """Start the server and wait until it accepts connections."""
        if not _moto_importable():
            raise RuntimeError("moto server is not installed: pip install 'moto[server]'")
        command = [sys.executable, "-m", "shardherd.services.emulators.serial_moto", "-H", LOOPBACK,
                   "-p", str(self.port)]
        self._process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"},
        )
        process = self._process
        wait_until(lambda: port_open(self.port), self._startup_timeout, "moto server",
                   lambda: process.poll() is None)
        return self

    def stop(self) -> None:
        """Stop the server and its process group; idempotent."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _moto_importable() -> bool:
    try:
        import moto.moto_server.werkzeug_app  # noqa: F401
    except ImportError:
        return False
    return True
