"""An h2c (cleartext HTTP/2, prior knowledge) to HTTP/1.1 proxy in front of kinesalite, for Java KCL workers.

The AWS Java SDK's async Kinesis client, which KCL uses, speaks HTTP/2 with prior knowledge to an `http://`
endpoint; kinesalite speaks HTTP/1.1 only. This Node process (node's own `http2` module, no npm package) listens on
a loopback port and forwards every request to the emulator. boto3 clients keep talking to the emulator directly.
"""

from __future__ import annotations

from pathlib import Path

from shardherd.services.emulators.kinesalite import EMULATORS_DIR, NodeEmulator
from shardherd.services.emulators.ports import port_open

PROXY_SCRIPT = EMULATORS_DIR / "h2c_proxy.js"


class H2cProxy(NodeEmulator):
    """Forwards HTTP/2 prior-knowledge requests on its own loopback port to `target_port` as HTTP/1.1."""

    package = "h2c_proxy"

    def __init__(self, target_port: int, port: int | None = None) -> None:
        super().__init__(port=port, startup_timeout=30.0)
        self.target_port = target_port

    def _package_dir(self) -> Path:
        return EMULATORS_DIR  # needs no npm package: node's built-in modules only

    def _script(self, package_dir: Path) -> str:
        return (f"const TARGET_PORT = {self.target_port}; const LISTEN_PORT = {self.port};\n"
                + PROXY_SCRIPT.read_text(encoding="utf-8"))

    def _answers(self) -> bool:
        return port_open(self.port)  # an HTTP/1.1 probe is not HTTP/2: a TCP accept is the readiness signal
