"""Loopback port helpers shared by the emulator launchers."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(ready: Callable[[], bool], timeout: float, what: str, alive: Callable[[], bool]) -> None:
    """Poll `ready` every 50 ms until it is true; raise RuntimeError after `timeout` s or if `alive` turns false."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{what} exited before it was ready")
        if ready():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} was not ready after {timeout:.0f} s")


def port_open(port: int) -> bool:
    """True if something accepts TCP connections on 127.0.0.1:port."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.2):
            return True
    except OSError:
        return False
